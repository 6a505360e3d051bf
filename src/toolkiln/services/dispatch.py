"""Built-in tools behind the router: input checked against the built-in's schema, the
workspace policy applied, the call audited (source ``llm``, ``code`` or ``api``) with its cost
and outcome. Only the router calls this; whoever the caller is, the path is the same. Under a
dry budget (a generation's example runs) a built-in whose spec has ``effects`` is not run:
it answers ``dry_run``, decided here, not by each built-in."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec, dry_run
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.domain.origin import Origin
from toolkiln.domain.problems import scrub
from toolkiln.domain.records import BUILTIN_NAMES, Policy
from toolkiln.domain.results import Result, error, refused
from toolkiln.domain.schema.validation import compile_validator, input_problems
from toolkiln.services.ports import BuiltinTool

log = logging.getLogger("toolkiln.builtins")


def summary(payload: Any) -> Any:
    """What the audit keeps of an input: keys and short values, never whole bodies. Made
    from what the caller sent before it is validated, so it is made storable here, whatever
    was sent: text with NUL or lone surrogates (which no JSONB column takes) is scrubbed, and a
    number that is not finite (``1e400`` reads as infinity) is kept as its name."""
    if not isinstance(payload, dict):
        return {"type": type(payload).__name__}
    out: dict[str, Any] = {}
    for key, value in list(payload.items())[:20]:
        name = scrub(str(key)[:64])
        if isinstance(value, str):
            out[name] = scrub(value[:80]) + ("..." if len(value) > 80 else "")
        elif isinstance(value, float) and not math.isfinite(value):
            out[name] = str(value)
        elif isinstance(value, int | float | bool) or value is None:
            out[name] = value
        else:
            out[name] = f"<{type(value).__name__}>"
    return out


class Builtins:
    """The in-process built-ins (``run_code`` runs in the sandbox and is the router's),
    each known by its spec's name, which must be one of ``BUILTIN_NAMES`` (the names a
    workspace policy may allow): tests/services/test_dispatch.py."""

    def __init__(self, tools: Iterable[BuiltinTool]) -> None:
        builtins: dict[str, BuiltinTool] = {}
        for tool in tools:
            name = tool.spec.name
            if name not in BUILTIN_NAMES or name in builtins:
                raise ValueError(f"built-in {name!r} is unknown to the policy or given twice")
            builtins[name] = tool
        self._builtins = builtins
        # The built-ins' schemas are the service's own: their patterns are searched by re.
        self._validators = {
            n: compile_validator(t.spec.input_schema, None) for n, t in builtins.items()
        }

    def specs(self) -> list[BuiltinSpec]:
        return [self._builtins[n].spec for n in sorted(self._builtins)]

    def knows(self, name: str) -> bool:
        return name in self._builtins

    def call(self, origin: Origin, policy: Policy, name: str, payload: Any) -> Result:
        """Never raises for the caller's sake: every outcome is a Result. The audit row
        joins ``origin.rows``, written with the run (or the root call) it belongs to."""
        started = time.perf_counter()
        call = BuiltinCall(
            origin.workspace_id,
            policy,
            origin.caller.source,
            origin.call_id,
            origin.caller.agent_id,
            origin.deadline,  # the root call's, or sooner the calling run's
            egress=origin.egress if origin.egress is not None else tuple(policy.egress),
        )
        tool = self._builtins[name]
        if problems := input_problems(self._validators[name], payload):
            err = error("invalid_input", "The input does not match the schema.", problems)
            result = refused(origin.call_id, None, None, err)
        elif origin.budget.holds_back(tool.spec.effects):
            result = refused(origin.call_id, None, None, dry_run(name))
        else:
            result = self._run(tool, name, payload, call, origin.call_id)
        result.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        data = {
            "name": name,
            "input": summary(payload),
            "status": result.status,
            "error": result.error["code"] if result.error else None,
            "duration_ms": result.duration_ms,
            "cost": {"calls": 1, **call.cost},
        }
        origin.rows.append(origin.row("builtin.called", data))
        origin.rows.extend(origin.row(event, data) for event, data in call.events)
        return result

    @staticmethod
    def _run(tool: BuiltinTool, name: str, payload: Any, call: BuiltinCall, call_id: str) -> Result:
        try:
            value = tool.call(payload, call)
        except BuiltinFailure as failure:
            err = error(failure.code, failure.message, failure.details)
            return refused(call_id, None, None, err)
        except ServiceUnavailable:
            raise  # the database is away: an outage for the caller (Router), not a bug here
        except Exception:  # a built-in's bug must not take the caller down
            log.exception("built-in %s failed", name)
            err = error("builtin_failed", f"{name} failed inside the service.")
            return refused(call_id, None, None, err)
        text = json.dumps(value, ensure_ascii=False)
        return Result(call_id, None, None, "ok", message=text, raw_data=value, llm=text)
