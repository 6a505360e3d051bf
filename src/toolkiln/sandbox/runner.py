"""The sandboxed Python runner: one warm, jailed child per call; the host decides the outcome."""

from __future__ import annotations

import contextlib
import logging
import secrets
import signal
import socket
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkiln.domain.execution import RunLink, RunOutcome, RunRequest
from toolkiln.sandbox.cgroups import Cgroups
from toolkiln.sandbox.compiled import Compiled
from toolkiln.sandbox.fair import FairShare
from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.packages import PYTHON_PACKAGES, PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable, Template, WarmChild
from toolkiln.sandbox.session import Session
from toolkiln.sandbox.shares import JoinFailed, Membership, enter
from toolkiln.sandbox.uids import NoUidRange, UidRange

log = logging.getLogger("toolkiln.sandbox")
# A Python child is made and warmed at this nice value and put back to the service's
# priority when it is taken for a call: making the next children must not take the core
# from the call in flight (docs/decisions/100-warm-children-from-a-template.md).
WARM_NICE = 10
# How long a run whose channel closed waits for its process's exit status (never past its
# deadline but for the grace, for an exit reported just after it).
EXIT_WAIT_S = 2.0
EXIT_GRACE_S = 0.2
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


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-call limits. Documented in docs/security.md."""

    memory_mb: int = 256
    max_threads: int = 16
    max_open_files: int = 64
    max_file_mb: int = 16
    scratch_mb: int = 64  # a call's scratch: its uid's own tmpfs (a uid serves one call)
    scratch_files: int = 8192  # files and directories in it
    max_cpu_s: int = 31
    cpus: float = 1.0  # CPU time per wall-clock second for a call and everything under it
    concurrent_calls: int = 32  # Python processes running at once (JavaScript: its workers)
    caps: protocol.Caps = field(default_factory=protocol.Caps)  # frame sizes, quotas


def _stdlib_paths() -> list[str]:
    base = sys.base_prefix
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return [f"{base}/lib/{ver}", f"{base}/lib/{ver}/lib-dynload"]


def _ro_paths() -> list[str]:
    """What CPython and its extension modules need, read-only: the native libraries (the
    multiarch directory, not the rest of /usr/lib with the host's other software), time
    zones and the standard library (not the interpreter's whole prefix); nothing of the
    service."""
    native = "/usr/lib/x86_64-linux-gnu"  # seccomp.py allows x86_64 only
    libs = [native] if Path(native).is_dir() else ["/usr/lib"]
    paths = ["/lib", "/lib64", *libs, "/usr/lib64", "/usr/share/zoneinfo", _stdlib_paths()[0]]
    return [p for p in paths if Path(p).exists() or Path(p).is_symlink()]


def _hidden_paths() -> list[str]:
    """Python packages inside the bound directories that are not the curated ones (the
    stdlib's site-packages, Debian's python3 trees): covered by an empty mount in the jail."""
    stdlib = _stdlib_paths()[0]
    found = [f"{stdlib}/site-packages", f"{stdlib}/dist-packages"]
    for lib in ("/usr/lib", "/usr/lib64", "/usr/local/lib"):
        found += [str(p) for p in sorted(Path(lib).glob("python3*")) if str(p) != stdlib]
    return [p for p in found if Path(p).is_dir() and not Path(p).is_symlink()]


class PythonSandbox:
    """Runs Python tool code in jailed children of one template process."""

    language = "python"

    def __init__(
        self,
        packages: PackageStore,
        *,
        limits: Limits | None = None,
        warm: int = 8,
        strict: bool = True,
        name: str = "py",
    ) -> None:
        self.limits = limits or Limits()
        self.packages = packages
        self.strict = strict
        self.warm = warm
        # Python processes are made per call: at most this many run at once (32 x 256 MB
        # bounds the memory they can hold), shared fairly between workspaces.
        self.fair = FairShare(self.limits.concurrent_calls)
        lim = self.limits
        try:
            self.uids = UidRange()  # this sandbox's alone on the host (sandbox/uids.py)
        except NoUidRange as exc:
            raise SandboxUnavailable(str(exc)) from exc
        # Address space = what the template already maps + the memory cap + thread stacks.
        self.config: dict[str, Any] = {
            "ro_paths": _ro_paths(),
            "packages_dir": str(packages.root),
            "stdlib_paths": _stdlib_paths(),
            "hidden": _hidden_paths(),
            "scratch_mb": lim.scratch_mb,
            "scratch_files": lim.scratch_files,
            "uid_base": self.uids.first,
            "uid_count": self.uids.count,
            "warm": warm,
            "warm_nice": WARM_NICE,
            # A child serves one call: its replacement is asked for by the pool's reader
            # thread when its end is reported, not by the call's thread (pool.py).
            "replace_on_exit": True,
            # It warms up outside its slot's CPU group and enters it when taken (pool.py).
            "cpu_when_taken": True,
            "max_cpu_s": lim.max_cpu_s,
            "address_space_mb": lim.memory_mb + 512,
            "max_threads": lim.max_threads,
            "max_open_files": lim.max_open_files,
            "max_file_mb": lim.max_file_mb,
            "max_log_bytes": lim.caps.log_bytes,
            "max_result_bytes": lim.caps.result_bytes,
            "max_request_bytes": lim.caps.request_bytes,
            "max_reply_bytes": lim.caps.reply_bytes,
            "curated": {k: v[0] for k, v in PYTHON_PACKAGES.items()},
        }
        try:
            # Named by the uid slot, which is this sandbox's alone while it lives: what a
            # process that died without closing left is the next one of its slot's to reuse
            # and remove, so leftovers cannot pile up (one id-named tree per crash did).
            cgroups: Cgroups | None = Cgroups(
                f"{name}-u{self.uids.slot}",
                lim.memory_mb * 1024 * 1024,
                lim.max_threads + 4,
                lim.cpus,
            )
        except OSError as exc:
            log.error("cgroups unavailable: %s", exc)
            cgroups = None
        self.cgroups = cgroups
        if not strict:
            log.warning(
                "INSECURE SANDBOX MODE: isolation layers that cannot be set up are skipped. "
                "Never run untrusted code like this."
            )
        self.compiled = Compiled()
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="toolkiln-compile")
        self._configure(self.config)
        lean, with_asyncio = self._template_configs(self.config)
        self.async_template: Template | None = None
        try:
            self.template = Template(lean, cgroups, strict=strict)
            if with_asyncio is not None:
                self.async_template = Template(with_asyncio, cgroups, strict=strict)
        except BaseException:
            # What a sandbox that never started holds: the first template's children (in
            # cgroup slots), the cgroup tree, the compile thread and the uid slot.
            if getattr(self, "template", None) is not None:
                self.template.close()
            if cgroups is not None:
                with contextlib.suppress(OSError):
                    cgroups.close()
            self._compiler.shutdown(wait=False)
            self.uids.release()
            raise
        for template in self.templates():
            if template.problems:
                log.warning("sandbox layers off: %s", "; ".join(template.problems))

    def _template_configs(
        self, config: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Two templates in one uid slot, with disjoint uids: one without asyncio, one with
        it for code that says ``async`` (``needs_asyncio``). With asyncio in every child,
        a fork and an exit cost more for every tool
        (docs/decisions/104-what-the-python-template-holds.md)."""
        lean_count = int(config["uid_count"]) - ASYNC_UIDS
        lean = {**config, "uid_count": lean_count}
        with_asyncio = {
            **config,
            "uid_base": int(config["uid_base"]) + lean_count,
            "uid_count": ASYNC_UIDS,
            "warm": min(int(config["warm"]), ASYNC_WARM_MAX),
            "asyncio": True,
        }
        return lean, with_asyncio

    def templates(self) -> list[Template]:
        """Every pool of this sandbox (Python: two, JavaScript: one)."""
        return [t for t in (self.template, self.async_template) if t is not None]

    def _health(self) -> dict[str, Any]:
        """The pools' health as one (the shape of ``Template.health``)."""
        pools = self.templates()
        each = [t.health() for t in pools]
        reasons = [
            h["reason"] if t is self.template else f"the template for async code: {h['reason']}"
            for t, h in zip(pools, each, strict=True)
            if h["degraded"]
        ]
        return {
            "degraded": bool(reasons),
            "reason": "; ".join(r for r in reasons if r) or None,
            "warm": sum(h["warm"] for h in each),
            "template_restarts": sum(h["template_restarts"] for h in each),
            "dead_children_discarded": sum(h["dead_children_discarded"] for h in each),
        }

    def describe(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "available": True,
            "ready": all(t.alive for t in self.templates()),
            "pool": self._health(),  # for /healthz: degraded, why, what was healed
            "insecure": any(t.problems for t in self.templates()),
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
                "agentId",
                "agentName",
                "powerUserId",
                "toolCallId",
                "conversationId",
                "agent_id",
                "agent_name",
                "power_user_id",
                "tool_call_id",
                "conversation_id",
                "tools.<name>(input)",
                "tools['<name>'](input)",
                "audit(event, data=None)",
            ],
            "limits": {
                "timeout_ms": {"default": 5000, "max": 30000},
                "memory_mb": lim.memory_mb,
                "cpus": lim.cpus if self.cgroups is not None and self.cgroups.cpu else None,
                "threads": lim.max_threads,
                "open_files": lim.max_open_files,
                "file_size_mb": lim.max_file_mb,
                "scratch_mb": lim.scratch_mb,
                "scratch_files": lim.scratch_files,
                "stdout_bytes": lim.caps.log_bytes,
                "stderr_bytes": lim.caps.log_bytes,
                "result_bytes": lim.caps.result_bytes,
                "ctx_reply_bytes": lim.caps.reply_bytes,
                "audit_rows": lim.caps.audit_rows,
                "audit_row_bytes": lim.caps.audit_row_bytes,
                "audit_bytes": lim.caps.audit_bytes,
                "ctx_calls": 50,
                "concurrent_calls": self.fair.workers,
                "concurrent_calls_per_workspace": self.fair.cap,
            },
            "isolation": {
                **self.template.layers,
                "process_per_call": True,
                "network": "none: own network namespace, loopback down, socket() refused",
            },
            "dependencies": self.packages.listing(),
        }

    def prepare(self, imports: Sequence[str]) -> None:
        """Start installing, in the background, the listed packages among ``imports`` (what
        a tool's code imports): called when code is saved, so its first call finds them."""
        self.packages.prepare(imports)

    def run(self, req: RunRequest, link: RunLink) -> RunOutcome:
        """The host decides from the code's analysis (``req.imports``) which listed packages
        it needs; a call waits for their install at most until its own deadline, then runs
        with its full time."""
        deadline = time.monotonic() + req.timeout_ms / 1000
        problems = self.packages.ensure(req.imports, deadline)
        if problems:
            return RunOutcome("infra", message="; ".join(problems))
        key = Compiled.key(req.workspace_id, req.code)
        made = self.compiled.get(key)
        if made is None and self.compiled.wanted(key):
            self._compile_later(key, req)
        if made is not None and len(made) + len(req.code) > self.limits.caps.request_bytes // 4:
            # The run frame (code, input, context) stays under its cap (4 MiB): code is at
            # most 256K characters (<= 1.5 MiB as JSON), an input at most the 1 MiB body (or
            # a nested run's ~1.1 MiB frame), and compiled text only goes with code that
            # comes to at most 1 MiB with it.
            made = None
        return self._run_once(req, link, {"compiled": made} if made is not None else None)

    def _compile_later(self, key: tuple[str, str], req: RunRequest) -> None:
        """Compile ``req``'s code in a child of its own, in the background (compiled.py): its
        request holds the source and nothing of the call (no input, context or ctx link).
        One compile at a time (one thread), outside the workspaces' fair shares: it takes no
        turn of its workspace (it does take a ready child, which the pool replaces)."""
        source = RunRequest(
            "python", req.code, req.entry, {}, COMPILE_TIMEOUT_MS, workspace_id=req.workspace_id
        )

        def compile_it() -> None:
            made = None
            try:
                started = time.perf_counter()
                deadline = time.monotonic() + COMPILE_TIMEOUT_MS / 1000
                link, extra = _SourceOnly(), {"compile_only": True}
                out = self._run_acquired(source, link, extra, started, deadline)
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

    def _run_once(
        self,
        req: RunRequest,
        link: RunLink,
        extra: dict[str, Any] | None = None,
    ) -> RunOutcome:
        """One call; ``extra`` adds runtime-specific fields to the request frame."""
        started = time.perf_counter()
        deadline = time.monotonic() + req.timeout_ms / 1000
        if req.not_after is not None:
            # A nested run ends with its caller, however long it waited before this (a
            # package install): until 2026-12-02 its time started again here, and a 2 s call
            # whose nested run waited 1.5 s for an install took 3.5 s
            # (tests/security/test_nested_deadlines.py).
            deadline = min(deadline, req.not_after)
        if not self._acquire(req, deadline):
            # The call never got a process: its time ran out waiting, not running.
            return RunOutcome(
                "timeout",
                details={"reason": "no sandbox process became free in time", "counted": False},
            )
        try:
            return self._run_acquired(req, link, extra, started, deadline)
        finally:
            self._relinquish(req)

    def _acquire(self, req: RunRequest, deadline: float) -> bool:
        """The call's turn for a process, shared fairly between workspaces (sandbox/fair.py):
        nested runs count toward their workspace's share like root calls."""
        return self.fair.acquire(req.workspace_id, deadline)

    def _relinquish(self, req: RunRequest) -> None:
        self.fair.release(req.workspace_id)

    def _run_acquired(
        self,
        req: RunRequest,
        link: RunLink,
        extra: dict[str, Any] | None,
        started: float,
        deadline: float,
    ) -> RunOutcome:
        try:
            wait = max(1.0, req.timeout_ms / 1000)
            if req.not_after is not None:  # a nested run: not past its caller's deadline
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            child = self._take(req, wait)
        except SandboxUnavailable as exc:
            return RunOutcome("infra", message=str(exc))
        try:
            admitted = link.admit()  # may read the database: an outage raises here
            member = enter(req, child, self.cgroups) if admitted else None
        except JoinFailed:
            self._release(child, None, clean=False)
            return RunOutcome("infra", message="The nested run could not share its call's limits.")
        except BaseException:
            self._release(child, None, clean=False)  # never leave a taken child unreleased
            _pool_of(child).forget_exit(child)  # nobody will ask how it ended
            raise
        if member is None:
            self._release(child, RunOutcome("not_admitted"), clean=True)
            return RunOutcome("not_admitted")
        run = secrets.token_hex(8)  # every frame of this run must carry it
        session = Session(self.limits.caps, run, link, deadline, member.group.audit)
        outcome: RunOutcome | None = None
        chan: socket.socket | None = None
        clean = False  # the run ended by its own report, and nothing of it is left unread
        try:
            chan = self._open_channel(child)
            reader = protocol.Reader(chan)
            frame = {
                "op": protocol.RUN,
                "run": run,
                "code": req.code,
                "entry": req.entry,
                "input": req.input,
                "timeout_ms": req.timeout_ms,
                "context": req.context,
            }
            protocol.write(chan, protocol.encode({**frame, **(extra or {})}, repair=True), deadline)
            while outcome is None:
                raw = reader.recv(self.limits.caps.frame_bytes, deadline)
                msg = protocol.parse(raw, run, self.limits.caps, reader.repaired, reader.size)
                outcome = session.handle(msg, chan, reader.size)
            if session.ended and reader.pending():
                # More after the result: the channel is out of step, whatever the report says.
                outcome = RunOutcome("garbled", message="frames after the result")
            clean = session.ended and outcome.kind != "garbled"
        except protocol.FrameError as exc:
            outcome = self._from_frame_error(exc, child, deadline, member)
        except OSError as exc:
            eof = protocol.FrameError("eof", str(exc))
            outcome = self._from_frame_error(eof, child, deadline, member)
        finally:
            if chan is not None and chan is not child.sock:
                chan.close()
            member.exit()
            # Before the process (and the call's slot) can go to a call queued behind this
            # one: that call's admission then waits for this run's record (RunLink.ended).
            ended = getattr(link, "ended", None)
            if ended is not None:
                ended()
            self._release(child, outcome, clean)
        assert outcome is not None
        outcome.duration_ms = (time.perf_counter() - started) * 1000
        outcome.ctx_calls = session.calls
        return outcome

    def _open_channel(self, child: WarmChild) -> socket.socket:
        """The channel of one run. A Python child serves one run: its own socket is it."""
        return child.sock

    def _configure(self, config: dict[str, Any]) -> None:
        """Hook for other runtimes on the same jail."""

    def _take(self, req: RunRequest, timeout: float) -> WarmChild:
        # The replacement is asked for when this child's end is reported (pool.py), not
        # now: forking it while the call runs took a core from the call in flight.
        if self.async_template is not None and needs_asyncio(req.code):
            return self.async_template.take(timeout=timeout, replenish=False)
        return self.template.take(timeout=timeout, replenish=False)

    def _release(self, child: WarmChild, outcome: RunOutcome | None, clean: bool) -> None:
        """A Python child serves one call: it is killed whatever happened (another is
        asked for when its end is reported)."""
        child.close()
        if outcome is not None and outcome.kind not in {"crash", "violation", "memory"}:
            _pool_of(child).forget_exit(child)

    def _from_frame_error(
        self, exc: protocol.FrameError, child: WarmChild, deadline: float, member: Membership
    ) -> RunOutcome:
        # Past the deadline, whatever ended the process (our clock, or its CPU rlimit when
        # this thread woke late on a loaded host), the call ran out of time.
        if exc.kind == "timeout" or time.monotonic() >= deadline:
            return RunOutcome("timeout")
        if exc.kind == "too_large":
            return RunOutcome("too_large", details={"max_bytes": self.limits.caps.result_bytes})
        if exc.kind == "garbage":
            return RunOutcome("garbled", message=str(exc))
        # Its exit is waited for no later than the run's deadline (and a moment's grace, for
        # an exit reported just after it): a tool that closed its end of the channel just
        # before its deadline and went on held its place 2 s past it and ended as a crash
        # (until 2026-12-06; tests/security/test_jail_surface.py).
        left = deadline - time.monotonic()
        info = _pool_of(child).wait_exit(child, timeout=min(EXIT_WAIT_S, max(left, EXIT_GRACE_S)))
        if info is None:
            if time.monotonic() >= deadline:
                return RunOutcome("timeout")
            return RunOutcome("crash", message="its exit status is unknown.")
        if info.oom or (info.signal == signal.SIGKILL and member.shared_oom()):
            # A nested run's process killed by its call's shared cap: its own slot saw no OOM.
            return RunOutcome("memory")
        if info.outside:  # not the tool's doing (pool.judge): not counted against it
            return RunOutcome("infra", message=info.outside)
        if info.signal == signal.SIGSYS:
            return RunOutcome("violation", details={"signal": "SIGSYS"})
        if info.signal == signal.SIGXCPU:
            return RunOutcome("timeout", details={"reason": "cpu time limit"})
        if info.signal is not None:
            name = (
                signal.Signals(info.signal).name
                if info.signal in signal.valid_signals()
                else info.signal
            )
            return RunOutcome(
                "crash", message=f"It was killed by {name}.", details={"signal": str(name)}
            )
        return RunOutcome(
            "crash", message=f"It exited with status {info.code}.", details={"exit_code": info.code}
        )

    def close(self) -> None:
        self._compiler.shutdown(wait=False, cancel_futures=True)
        for template in self.templates():
            template.close()
        if self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.close()
        self.uids.release()


def _pool_of(child: WarmChild) -> Template:
    """The template that made ``child``: its pid and generation mean something there only."""
    assert child.home is not None  # every child is made by a Template, which sets it
    return child.home


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
