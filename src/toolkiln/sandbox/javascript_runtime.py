"""JavaScript on the jailed runner: V8 (mini-racer, jitless) in long-lived jailed workers.

Same jail, protocol and host-side classification as Python (runner.py); what differs:
a worker serves several calls, each in a fresh V8 isolate, and is retired after
``RECYCLE_AFTER`` calls or at once after any timeout, crash, memory limit or odd report.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from pathlib import Path
from typing import Any

import py_mini_racer

from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.domain.origin import CTX_CALLER_FIELDS
from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.packages import JS_PACKAGES
from toolkiln.sandbox.pool import SandboxUnavailable, WarmChild
from toolkiln.sandbox.runner import Attached

RECYCLE_AFTER = 50


CLEAN = {"return", "exception", "not_admitted"}


def _quiet(child: WarmChild) -> bool:
    """The worker's control socket has nothing to say: it never writes there, so any byte
    (or its close) means it is not a worker to hand another call."""
    return not protocol.readable(child.sock, 0)


class JavaScriptRuntime(Attached):
    """Workers serve one workspace each: a worker that served another workspace is retired
    rather than handed over (``take``)."""

    language = "javascript"

    def __init__(self) -> None:
        self.retired_for_another_workspace = 0
        self._owned: set[tuple[int, int]] = set()  # live workers that serve a workspace
        self._owned_lock = threading.Lock()

    def places(self) -> int:
        return self._box().warm

    def configs(self, base: JailConfig) -> list[JailConfig]:
        """One template: a JavaScript worker's runner imports asyncio anyway."""
        box = self._box()
        engine = Path(py_mini_racer.__file__).resolve().parent
        return [
            base.replace(
                warm=box.warm + 1,  # one spare, unowned worker (see take)
                # RLIMIT_CPU is a process's, and a worker serves up to RECYCLE_AFTER calls:
                # its limit covers two calls' worth, and it retires itself once less than
                # one call's worth is left (jsrunner.spent). With the per-call limit for the
                # worker's whole life, a call was killed (a counted "cpu time limit"
                # timeout) for the CPU time the worker's earlier calls had used.
                worker_cpu_s=2 * box.limits.max_cpu_s,
                js_engine_parent=str(engine.parent),  # only without a jail (insecure mode)
                binds={"/engine/py_mini_racer": str(engine)},
                js_heap_mb=box.limits.memory_mb // 2,
                js_listed=tuple(sorted(JS_PACKAGES)),  # named by require's error; set up ahead
                preload=("asyncio", "json", "re"),
                warm_nice=0,  # a worker serves calls for its whole life
                replace_on_exit=False,  # a retired worker's successor is asked for
                cpu_when_taken=False,  # a worker is in its slot for its whole life
            )
        ]

    def before(
        self, req: RunRequest, deadline: float
    ) -> tuple[RunRequest, dict[str, Any]] | RunOutcome:
        """What runs is the code's script form (``req.script``: exports stripped, imports as
        ``require``; its analysis made it). Listed packages it imports are installed (by the
        host) before it runs; the call waits for them at most until its deadline."""
        packages = self._box().packages
        code = req.script or req.code
        listed = [n for n in req.imports if n in JS_PACKAGES]
        problems = packages.ensure(listed, deadline)
        if problems:
            return RunOutcome("infra", message="; ".join(problems))
        modules = {
            n: f"/pkgs/node_modules/{n}/{JS_PACKAGES[n][1]}"
            for n in listed
            if packages.installed(n)
        }
        return dataclasses.replace(req, code=code), {"modules": modules}

    def take(self, req: RunRequest, timeout: float) -> WarmChild:
        """A worker that has served no workspace but this one. A worker that served another
        workspace is retired rather than handed over, so even an escape from V8 into the
        worker process cannot reach another workspace's later calls. The pool keeps one
        spare, unowned worker, so a workspace without a worker of its own takes the spare
        (and the oldest idle worker of another workspace makes room for the next spare)
        instead of waiting for V8 to start."""
        template = self._box().template
        deadline = time.monotonic() + timeout
        mine = req.workspace_id

        def rank(child: WarmChild) -> int:
            return 0 if child.owner == mine else 1 if child.owner is None else 2

        while True:
            left = deadline - time.monotonic()
            child = template.take(timeout=max(0.0, left), replenish=False, rank=rank)
            if child.owner == mine:
                return child
            if child.owner is None:
                child.owner = mine
                self._restore_spare(child, mine)
                return child
            self.retired_for_another_workspace += 1
            self._retire(child, forget=True)

    def ready(self, req: RunRequest) -> bool:
        """A worker of the workspace's own, or the spare, is idle."""
        mine = req.workspace_id
        return any(c.owner in (mine, None) for c in self._box().template.idle())

    def _restore_spare(self, claimed: WarmChild, mine: str) -> None:
        """An unowned worker was claimed. The pool holds ``warm`` + 1 workers; once more than
        ``warm`` are owned, the oldest idle worker of another workspace is retired, and its
        replacement is the next spare."""
        with self._owned_lock:
            self._owned.add((claimed.gen, claimed.pid))
            over = len(self._owned) > self._box().warm
        if over:
            self._evict_foreign(mine)

    def _evict_foreign(self, mine: str) -> None:
        """Retire the oldest idle worker of another workspace, if there is one."""
        template = self._box().template
        try:
            child = template.take(
                timeout=0, replenish=False, rank=lambda c: 0 if c.owner not in (None, mine) else 1
            )
        except SandboxUnavailable:
            return
        if child.owner in (None, mine):
            template.give_back(child)
            return
        self.retired_for_another_workspace += 1
        self._retire(child, forget=True)

    def _retire(self, child: WarmChild, forget: bool) -> None:
        """Kill a worker and ask for a fresh one; ``forget``: nobody will ask how it ended."""
        template = self._box().template
        with self._owned_lock:
            self._owned.discard((child.gen, child.pid))
        child.close()
        template.replace(child)
        if forget:
            template.forget_exit(child)

    def open_channel(self, child: WarmChild) -> socket.socket:
        """A channel of this call's own, handed to the worker over its control socket with
        one byte (SCM_RIGHTS) and closed when the call ends: nothing written on it can be
        read by the worker's next call, whatever state this call leaves it in."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(child.sock, [b"C"], [theirs.fileno()])
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    def release(self, child: WarmChild, outcome: RunOutcome | None, clean: bool) -> None:
        memory = outcome is not None and outcome.error_type == "MemoryError"
        if clean and outcome is not None and outcome.kind in CLEAN and not memory and _quiet(child):
            child.uses += 1
            if child.uses < RECYCLE_AFTER:
                self._box().template.give_back(child)
                return
        self._retire(
            child, outcome is not None and outcome.kind not in {"crash", "violation", "memory"}
        )

    def describe(self, described: dict[str, Any]) -> dict[str, Any]:
        box = self._box()
        isolation = {
            **described["isolation"],
            "channel": "a socketpair per call, passed to the worker",
            "worker_per_workspace": True,
            "engine": "V8 (mini-racer, jitless), a fresh isolate per call",
            "process_per_call": False,
            "uid": "per-worker unprivileged uid",
            "worker_recycled_after_calls": RECYCLE_AFTER,
        }
        limits = {
            **described["limits"],
            "heap_mb": box.limits.memory_mb // 2,
            "workers": box.warm,
            "workers_per_workspace": box.fair.cap,
        }
        return {
            **described,
            "entrypoints": [
                {"name": "main", "signature": "[export] [async] function main(params, ctx?)"},
                {"name": "handle", "signature": "[export] [async] function handle(input, ctx)"},
            ],
            "return_contract": (
                "main: an object with a string 'message' and optionally 'rawData', '_llm', "
                "'_render', '_interactive'. handle: any JSON value; an object with a string "
                "'message' is read as for main, anything else becomes raw_data."
            ),
            "ctx": [
                *CTX_CALLER_FIELDS,
                "tools.<name>(input) -> Promise",
                "tools['<name>'](input) -> Promise",
                "audit(event, data?) -> Promise",
            ],
            "isolation": isolation,
            "limits": limits,
        }

    def close(self) -> None:
        return None
