"""The one path every built-in call takes, whether a model or tool code is the caller:
input checked against the built-in's schema, the workspace policy applied, the call
audited (source ``llm``, ``code`` or ``api``) with its cost and outcome."""

from __future__ import annotations

import logging
import time
from typing import Any

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec
from toolkiln.domain.records import AuditRow, Policy
from toolkiln.domain.schema import compile_validator, input_problems
from toolkiln.services.ports import BuiltinTool, UnitOfWorkFactory

log = logging.getLogger("toolkiln.builtins")


def envelope(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": code, "details": details if details is not None else {"message": message}}


def _summary(payload: Any) -> Any:
    """What the audit keeps of an input: keys and short values, never whole bodies."""
    if not isinstance(payload, dict):
        return {"type": type(payload).__name__}
    out: dict[str, Any] = {}
    for key, value in list(payload.items())[:20]:
        if isinstance(value, str):
            out[str(key)[:64]] = value[:80] + ("..." if len(value) > 80 else "")
        elif isinstance(value, int | float | bool) or value is None:
            out[str(key)[:64]] = value
        else:
            out[str(key)[:64]] = f"<{type(value).__name__}>"
    return out


class Dispatcher:
    def __init__(self, uow: UnitOfWorkFactory, builtins: dict[str, BuiltinTool]) -> None:
        self._uow = uow
        self._builtins = builtins
        self._validators = {n: compile_validator(t.spec.input_schema) for n, t in builtins.items()}

    def specs(self) -> list[BuiltinSpec]:
        return [self._builtins[n].spec for n in sorted(self._builtins)]

    def knows(self, name: str) -> bool:
        return name in self._builtins

    def call(
        self,
        workspace_id: str,
        name: str,
        payload: Any,
        *,
        source: str,
        tool_call_id: str | None = None,
        agent_id: str | None = None,
        tool_id: str | None = None,
        deadline: float | None = None,
        policy: Policy | None = None,
        sink: list[AuditRow] | None = None,
    ) -> dict[str, Any]:
        """Never raises for the tool's sake: every outcome is a result or an error envelope.

        Calls from tool code pass the policy read at the start of the invocation and a
        ``sink``: their audit rows are then written with the invocation, in order, in its
        one transaction, instead of one transaction per call.
        """
        started = time.perf_counter()
        if policy is None:
            with self._uow(readonly=True) as tx:
                policy = tx.workspaces.policy(workspace_id)
        call = BuiltinCall(workspace_id, policy, source, tool_call_id, agent_id, deadline)
        tool = self._builtins.get(name)
        if tool is None:
            result = envelope(
                "unknown_tool", f"No built-in tool named {name[:64]!r}.", {"name": name[:64]}
            )
        elif name not in policy.builtins:
            result = envelope(
                "not_allowed", f"The workspace does not allow {name}.", {"name": name}
            )
        elif problems := input_problems(self._validators[name], payload):
            result = envelope("invalid_input", "The input does not match the schema.", problems)
        else:
            try:
                result = tool.call(payload, call)
            except BuiltinFailure as failure:
                result = failure.envelope()
            except Exception:  # a built-in's bug must not take the caller down
                log.exception("built-in %s failed", name)
                result = envelope("builtin_failed", f"{name} failed inside the service.")
        duration = round((time.perf_counter() - started) * 1000, 3)
        error = result.get("error") if isinstance(result, dict) else None
        data = {
            "name": name[:64],
            "input": _summary(payload),
            "status": "error" if error else "ok",
            "error": error,
            "duration_ms": duration,
            "cost": {"calls": 1, **call.cost},
        }
        row = AuditRow(
            workspace_id,
            "builtin.called",
            source=source,
            tool_id=tool_id,
            tool_call_id=tool_call_id,
            agent_id=agent_id,
            data=data,
        )
        if sink is not None:
            sink.append(row)
        else:
            with self._uow() as tx:
                tx.audit.add(row)
        return result
