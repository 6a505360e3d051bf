"""The jailed runner: warm, jailed processes of one template (or two) and the host's side of
each call, in whichever language its runtime speaks.

A ``Sandbox`` is composed with a ``Runtime`` (python_runtime.py, javascript_runtime.py): the
runtime says how the jail is configured for its language,
what a run frame carries besides the call, and how a process is taken, given a channel and
handed back; the sandbox owns the rest (uids, cgroups, fair shares, the templates, the
frames of a run and the host's judgement of how it ended)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from toolkiln.domain.execution import RunLink, RunOutcome, RunRequest
from toolkiln.sandbox import selftest
from toolkiln.sandbox.cgroups import Cgroups
from toolkiln.sandbox.fair import FairShare
from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.layers import Missing, refused
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.pool import LayerRefused, SandboxUnavailable, Template, WarmChild
from toolkiln.sandbox.session import Session
from toolkiln.sandbox.shares import JoinFailed, Membership, enter
from toolkiln.sandbox.uids import NoUidRange, UidRange

log = logging.getLogger("toolkiln.sandbox")
# How long a run whose channel closed waits for its process's exit status (never past its
# deadline but for the grace, for an exit reported just after it).
EXIT_WAIT_S = 2.0
EXIT_GRACE_S = 0.2


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


class Runtime(Protocol):
    """A language on the jailed runner (composition, not a subclass): what differs between
    Python and JavaScript. ``attach`` gives it the sandbox it serves, once, at its start
    (``Attached`` holds it)."""

    language: str

    def attach(self, sandbox: Sandbox) -> None: ...
    def configs(self, base: JailConfig) -> list[JailConfig]:
        """The template configurations of this runtime (the first one is the main pool)."""
        ...

    def places(self) -> int:
        """How many calls may run at once (the fair share's workers)."""
        ...

    def before(
        self, req: RunRequest, deadline: float
    ) -> tuple[RunRequest, dict[str, Any]] | RunOutcome:
        """The request as the jail runs it and the runtime's fields of its run frame, or an
        outcome that ends it before it starts (a package that cannot be installed)."""
        ...

    def take(self, req: RunRequest, timeout: float) -> WarmChild: ...
    def ready(self, req: RunRequest) -> bool:
        """Whether ``take`` would find a process for ``req`` at once (a hint)."""
        ...

    def open_channel(self, child: WarmChild) -> socket.socket: ...
    def release(self, child: WarmChild, outcome: RunOutcome | None, clean: bool) -> None: ...
    def describe(self, described: dict[str, Any]) -> dict[str, Any]: ...
    def close(self) -> None: ...


class Attached:
    """What every ``Runtime`` holds: the sandbox it serves, given once by ``attach`` at its
    start; asking for it before then is a bug."""

    sandbox: Sandbox | None = None

    def attach(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def _box(self) -> Sandbox:
        assert self.sandbox is not None, "attached by the sandbox it serves"
        return self.sandbox


class Sandbox:
    """Runs tool code in jailed processes of its templates, in its runtime's language."""

    def __init__(
        self,
        runtime: Runtime,
        packages: PackageStore,
        *,
        limits: Limits | None = None,
        warm: int = 8,
        strict: bool = True,
        name: str = "py",
        accept: tuple[str, ...] = (),
        cgroup_parent: str = "",
    ) -> None:
        self.runtime = runtime
        self.language = runtime.language
        # Layers the runner itself started without, accepted (cli/runner.py: runner_uid).
        self.runner_missing: tuple[Missing, ...] = ()
        self.limits = limits or Limits()
        self.packages = packages
        self.strict = strict
        self.warm = warm
        lim = self.limits
        try:
            self.uids = UidRange()  # this sandbox's alone on the host (sandbox/uids.py)
        except NoUidRange as exc:
            raise SandboxUnavailable(str(exc)) from exc
        caps = lim.caps
        # Address space = what the template already maps + the memory cap + thread stacks.
        base = JailConfig(
            runtime=runtime.language,
            ro_paths=tuple(_ro_paths()),
            packages_dir=str(packages.root),
            stdlib_paths=tuple(_stdlib_paths()),
            hidden=tuple(_hidden_paths()),
            scratch_mb=lim.scratch_mb,
            scratch_files=lim.scratch_files,
            uid_base=self.uids.first,
            uid_count=self.uids.count,
            warm=warm,
            max_cpu_s=lim.max_cpu_s,
            address_space_mb=lim.memory_mb + 512,
            max_threads=lim.max_threads,
            max_open_files=lim.max_open_files,
            max_file_mb=lim.max_file_mb,
            max_log_bytes=caps.log_bytes,
            max_result_bytes=caps.result_bytes,
            max_request_bytes=caps.request_bytes,
            max_reply_bytes=caps.reply_bytes,
            strict=strict,
            accept=accept,
        )
        runtime.attach(self)
        # Calls running at once, shared fairly between workspaces (sandbox/fair.py).
        self.fair = FairShare(runtime.places())
        configs = runtime.configs(base)
        self.config = configs[0]
        try:
            # Named by the uid slot, which is this sandbox's alone while it lives: what a
            # process that died without closing left is the next one of its slot's to reuse
            # and remove, so leftovers cannot pile up (one id-named tree per crash did).
            cgroups: Cgroups | None = Cgroups(
                f"{name}-u{self.uids.slot}",
                lim.memory_mb * 1024 * 1024,
                lim.max_threads + 4,
                lim.cpus,
                parent=cgroup_parent,
            )
            cgroup_problem = "no cgroup with memory and pids controllers"
        except OSError as exc:
            log.error("cgroups unavailable: %s", exc)
            cgroups, cgroup_problem = None, str(exc)
        self.cgroups = cgroups
        if not strict:
            log.warning(
                "INSECURE SANDBOX MODE: isolation layers that cannot be set up are skipped. "
                "Never run untrusted code like this."
            )
        self.pools: list[Template] = []
        try:
            for config in configs:
                self.pools.append(Template(config, cgroups, cgroup_problem))
        except BaseException:
            # What a sandbox that never started holds: the templates' children (in cgroup
            # slots), the cgroup tree, the runtime's threads and the uid slot.
            for template in self.pools:
                template.close()
            if cgroups is not None:
                with contextlib.suppress(OSError):
                    cgroups.close()
            runtime.close()
            self.uids.release()
            raise
        try:
            self._self_test(accept)
        except BaseException:
            self.close()
            raise
        for template in self.pools:
            if template.problems:
                log.warning("sandbox layers off: %s", "; ".join(template.problems))

    def _self_test(self, accept: tuple[str, ...]) -> None:
        """Each layer proved by its effect on a warm process of each template
        (sandbox/selftest.py); one not seen is missing, and stops the start unless
        accepted."""
        for template in self.pools:
            unseen = selftest.prove(template, self.limits.memory_mb * 1024 * 1024)
            template.missing.extend(unseen)
            stopping = refused(unseen, accept)
            if stopping and self.strict:
                raise LayerRefused(stopping)

    @property
    def template(self) -> Template:
        """The main pool (Python: the template for code that does not say async)."""
        return self.pools[0]

    @property
    def async_template(self) -> Template | None:
        """Python's pool for code that says ``async`` (python_runtime.needs_asyncio)."""
        return self.pools[1] if len(self.pools) > 1 else None

    def templates(self) -> list[Template]:
        """Every pool of this sandbox (Python: two, JavaScript: one)."""
        return list(self.pools)

    def pool_health(self) -> dict[str, Any]:
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

    def missing_layers(self) -> list[dict[str, str]]:
        """Each layer some template of this sandbox runs without, once, with why."""
        seen: dict[str, str] = {m.layer: m.reason for m in self.runner_missing}
        for template in self.templates():
            for m in template.missing:
                seen.setdefault(m.layer, m.reason)
        return [{"layer": k, "reason": v} for k, v in seen.items()]

    def at_once(self, req: RunRequest) -> bool:
        """Whether ``req`` arriving now would get its turn and a process without waiting
        (a hint: another run may take them first). A one-way run goes ahead only then
        (runners/server.py): one that waits must ask for admission again."""
        return self.fair.at_once(req.workspace_id) and self.runtime.ready(req)

    def load(self) -> dict[str, int]:
        """Places, calls running and calls waiting: what a placement decides on."""
        return {
            "places": self.fair.workers,
            "in_flight": self.fair.busy,
            "waiting": self.fair.waiting(),
        }

    def describe(self) -> dict[str, Any]:
        lim = self.limits
        return self.runtime.describe(
            {
                "available": True,
                "ready": all(t.alive for t in self.templates()),
                "pool": self.pool_health(),  # for /healthz: degraded, why, what was healed
                "insecure": any(t.problems for t in self.templates()),
                # The layers this host did not give and the operator accepted (layers.py).
                "missing_layers": self.missing_layers(),
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
        )

    def prepare(self, imports: Sequence[str]) -> None:
        """Start installing, in the background, the listed packages among ``imports`` (what
        a tool's code imports): called when code is saved, so its first call finds them."""
        self.packages.prepare(imports)

    def run(self, req: RunRequest, link: RunLink) -> RunOutcome:
        """The host decides from the code's analysis (``req.imports``) which listed packages
        it needs (the runtime's ``before``); a call waits for their install at most until its
        own deadline, then runs with its full time."""
        prepared = self.runtime.before(req, time.monotonic() + req.timeout_ms / 1000)
        if isinstance(prepared, RunOutcome):
            return prepared
        return self.run_once(*prepared, link)

    def run_once(self, req: RunRequest, extra: dict[str, Any], link: RunLink) -> RunOutcome:
        """One call; ``extra`` adds runtime-specific fields to the request frame."""
        started = time.perf_counter()
        deadline = time.monotonic() + req.timeout_ms / 1000
        if req.not_after is not None:
            # A nested run ends with its caller, however long it waited before this (a
            # package install; tests/security/test_nested_deadlines.py).
            deadline = min(deadline, req.not_after)
        if not self.fair.acquire(req.workspace_id, deadline):
            # The call never got a process: its time ran out waiting, not running.
            return RunOutcome("timeout", details=_no_process_in_time())
        try:
            return self.run_acquired(req, link, extra, started, deadline)
        finally:
            self.fair.release(req.workspace_id)

    def run_acquired(
        self,
        req: RunRequest,
        link: RunLink,
        extra: dict[str, Any] | None,
        started: float,
        deadline: float,
    ) -> RunOutcome:
        """A run that holds its turn (or needs none: a compile), from taking a process to
        handing it back."""
        try:
            wait = max(1.0, req.timeout_ms / 1000)
            if req.not_after is not None:  # a nested run: not past its caller's deadline
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            child = self.runtime.take(req, wait)
        except SandboxUnavailable as exc:
            if req.not_after is not None and time.monotonic() >= deadline:
                # Its time ran out waiting for a process, not running: a timeout, as when
                # no place came (tests/sandbox/test_wait_deadline.py).
                return RunOutcome("timeout", details=_no_process_in_time())
            return RunOutcome("infra", message=str(exc))
        try:
            admitted = link.admit()  # may read the database: an outage raises here
            member = enter(req, child, self.cgroups) if admitted else None
        except JoinFailed:
            self.runtime.release(child, None, clean=False)
            return RunOutcome("infra", message="The nested run could not share its call's limits.")
        except BaseException:
            self.runtime.release(child, None, clean=False)  # never leave a taken child
            _pool_of(child).forget_exit(child)  # nobody will ask how it ended
            raise
        if member is None:
            self.runtime.release(child, RunOutcome("not_admitted"), clean=True)
            return RunOutcome("not_admitted")
        run = secrets.token_hex(8)  # every frame of this run must carry it
        session = Session(self.limits.caps, run, link, deadline, member.group.audit)
        outcome: RunOutcome | None = None
        chan: socket.socket | None = None
        clean = False  # the run ended by its own report, and nothing of it is left unread
        # The caller may end the run from outside (a cancelled call) until its process is
        # handed back (optional: the sandbox tells the link when it has ``started``).
        on_process = getattr(link, "started", None)
        if on_process is not None:
            on_process(child.kill)
        try:
            chan = self.runtime.open_channel(child)
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
            if on_process is not None:
                on_process(None)
            ended = getattr(link, "ended", None)
            if ended is not None:
                ended()
            self.runtime.release(child, outcome, clean)
        assert outcome is not None
        outcome.duration_ms = (time.perf_counter() - started) * 1000
        outcome.ctx_calls = session.calls
        return outcome

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
        # before its deadline must not hold its place past it, nor end as a crash
        # (tests/security/test_jail_surface.py).
        left = deadline - time.monotonic()
        info = _pool_of(child).wait_exit(child, timeout=min(EXIT_WAIT_S, max(left, EXIT_GRACE_S)))
        if info is None:
            if time.monotonic() >= deadline:
                return RunOutcome("timeout")
            return RunOutcome("crash", message="its exit status is unknown.")
        if info.oom or (info.signal == signal.SIGKILL and member.shared_oom()):
            # A nested run's process killed by its call's shared cap: its own slot saw no OOM.
            return RunOutcome("memory")
        if info.outside:  # not the tool's doing (exits.judge): not counted against it
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
        self.runtime.close()
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


def _no_process_in_time() -> dict[str, Any]:
    """A run whose time ran out before it had a process: not counted against the tool."""
    return {"reason": "no sandbox process became free in time", "counted": False}
