"""Python on the jailed runner: one warm, jailed child per call, forked from one of two
templates (code that says ``async`` runs in the one that preloaded asyncio), and each
tool's code compiled once per workspace in a child of its own (compiled.py)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.domain.origin import CTX_CALLER_FIELDS
from toolkiln.sandbox.compiled import Compiled
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.packages import PYTHON_PACKAGES
from toolkiln.sandbox.pool import WarmChild
from toolkiln.sandbox.runner import Attached

if TYPE_CHECKING:
    import socket

log = logging.getLogger("toolkiln.sandbox")
# A Python child is made and warmed at this nice value and put back to the service's
# priority when it is taken for a call: making the next children must not take the core
# from the call in flight (docs/decisions/100-warm-children-from-a-template.md).
WARM_NICE = 10
COMPILE_TIMEOUT_MS = 10_000  # a compile child's run (the source's size is capped on save)
# Of a sandbox's uid slot (256), the uids of its template for code that says `async`: 32
# calls at once, at most ASYNC_WARM_MAX warm children and the ends still being reaped.
ASYNC_UIDS = 64
# Its warm children at most (TOOLKILN_SANDBOX_WARM may ask up to 128, which the other
# template's 192 uids hold with its 32 calls; these 64 would not).
ASYNC_WARM_MAX = 16


def needs_asyncio(code: str) -> bool:
    """Whether ``code`` runs in the template that preloaded asyncio: code that says
    ``async`` (``async def``, ``async with``, ``import asyncio``; ``await`` is only valid in
    an ``async def``). Other code runs in the template without it, whose forks are cheaper
    (docs/decisions/104-what-the-python-template-holds.md). The choice is only about speed: code
    that reaches asyncio without naming it (``__import__``, a package that imports it) still gets
    it, imported in its call, as any module the template did not preload."""
    return "async" in code


class PythonRuntime(Attached):
    """Python processes are made per call: at most ``Limits.concurrent_calls`` run at once
    (32 x 256 MB bounds the memory they can hold)."""

    language = "python"

    def __init__(self) -> None:
        self.compiled = Compiled()
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="toolkiln-compile")

    def places(self) -> int:
        return self._box().limits.concurrent_calls

    def configs(self, base: JailConfig) -> list[JailConfig]:
        """Two templates in one uid slot, with disjoint uids: one without asyncio, one with
        it for code that says ``async`` (``needs_asyncio``). With asyncio in every child,
        a fork and an exit cost more for every tool
        (docs/decisions/104-what-the-python-template-holds.md)."""
        python = base.replace(
            warm_nice=WARM_NICE,
            # A child serves one call: its replacement is asked for by the pool's reader
            # thread when its end is reported, not by the call's thread (pool.py).
            replace_on_exit=True,
            # It warms up outside its slot's CPU group and enters it when taken (pool.py).
            cpu_when_taken=True,
            curated={k: v[0] for k, v in PYTHON_PACKAGES.items()},
        )
        lean_count = python.uid_count - ASYNC_UIDS
        return [
            python.replace(uid_count=lean_count),
            python.replace(
                uid_base=python.uid_base + lean_count,
                uid_count=ASYNC_UIDS,
                warm=min(python.warm, ASYNC_WARM_MAX),
                asyncio=True,
            ),
        ]

    def before(
        self, req: RunRequest, deadline: float
    ) -> tuple[RunRequest, dict[str, Any]] | RunOutcome:
        box = self._box()
        problems = box.packages.ensure(req.imports, deadline)
        if problems:
            return RunOutcome("infra", message="; ".join(problems))
        key = Compiled.key(req.workspace_id, req.code)
        made = self.compiled.get(key)
        if made is None and self.compiled.wanted(key):
            self._compile_later(key, req)
        if made is not None and len(made) + len(req.code) > box.limits.caps.request_bytes // 4:
            # The run frame (code, input, context) stays under its cap (4 MiB): code is at
            # most 256K characters (<= 1.5 MiB as JSON), an input at most the 1 MiB body (or
            # a nested run's ~1.1 MiB frame), and compiled text only goes with code that
            # comes to at most 1 MiB with it.
            made = None
        return req, ({"compiled": made} if made is not None else {})

    def _compile_later(self, key: tuple[str, str], req: RunRequest) -> None:
        """Compile ``req``'s code in a child of its own, in the background (compiled.py): its
        request holds the source and nothing of the call (no input, context or ctx link).
        One compile at a time (one thread), outside the workspaces' fair shares: it takes no
        turn of its workspace (it does take a ready child, which the pool replaces)."""
        source = RunRequest(
            "python", req.code, req.entry, {}, COMPILE_TIMEOUT_MS, workspace_id=req.workspace_id
        )
        box = self._box()

        def compile_it() -> None:
            made = None
            try:
                started = time.perf_counter()
                deadline = time.monotonic() + COMPILE_TIMEOUT_MS / 1000
                link, extra = _SourceOnly(), {"compile_only": True}
                out = box.run_acquired(source, link, extra, started, deadline)
                if out.kind == "return" and isinstance(out.value, str):
                    made = out.value
            except Exception:  # a background task survives its own errors
                log.exception("compiling a tool's code ahead failed")
            finally:
                self.compiled.done(key, made)

        try:
            self._compiler.submit(compile_it)
        except RuntimeError:  # closing
            self.compiled.done(key, None)

    def take(self, req: RunRequest, timeout: float) -> WarmChild:
        # The replacement is asked for when this child's end is reported (pool.py), not
        # now: forking it while the call runs took a core from the call in flight.
        box = self._box()
        pool = box.async_template if needs_asyncio(req.code) else None
        return (pool or box.template).take(timeout=timeout, replenish=False)

    def ready(self, req: RunRequest) -> bool:
        box = self._box()
        pool = box.async_template if needs_asyncio(req.code) else None
        return bool((pool or box.template).idle())

    def open_channel(self, child: WarmChild) -> socket.socket:
        """The channel of one run. A Python child serves one run: its own socket is it."""
        return child.sock

    def release(self, child: WarmChild, outcome: RunOutcome | None, clean: bool) -> None:
        """A Python child serves one call: it is killed whatever happened (another is
        asked for when its end is reported)."""
        child.close()
        if outcome is not None and outcome.kind not in {"crash", "violation", "memory"}:
            assert child.home is not None
            child.home.forget_exit(child)

    def describe(self, described: dict[str, Any]) -> dict[str, Any]:
        return {
            **described,
            "entrypoints": [
                {
                    "name": "main",
                    "signature": "def main(**params) | async def main(**params, *, ctx)",
                },
                {
                    "name": "handle",
                    "signature": "def handle(input, ctx) | async def handle(input, ctx)",
                },
            ],
            "return_contract": (
                "main: a dict with a string 'message' and optionally 'rawData', '_llm', "
                "'_render', '_interactive'. handle: any JSON value; a dict with a string "
                "'message' is read as for main, anything else becomes raw_data."
            ),
            "ctx": [
                *CTX_CALLER_FIELDS,
                "agent_id",
                "agent_name",
                "power_user_id",
                "tool_call_id",
                "conversation_id",
                "tools.<name>(input)",
                "tools['<name>'](input)",
                "audit(event, data=None)",
            ],
        }

    def close(self) -> None:
        self._compiler.shutdown(wait=False, cancel_futures=True)


class _SourceOnly:
    """The link of a compile child's run: it admits the run and has nothing to give."""

    def admit(self) -> bool:
        return True

    def ended(self) -> None:
        return None

    def call(self, name: str, payload: Any) -> Any:
        return {"error": "unknown_tool"}

    def audit(self, event: str, data: Any) -> str | None:
        return None
