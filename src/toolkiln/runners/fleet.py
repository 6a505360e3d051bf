"""The runners an API process uses, and where each run goes.

- Discovery: ``TOOLKILN_RUNNERS`` lists addresses (``unix:/path``, ``host:port``); a host
  name is resolved to all its addresses and resolved again every ``RESOLVE_S`` (a
  Kubernetes headless Service names one address per runner pod).
- Health: a watcher asks each runner how it is every ``CHECK_S``; a runner that does not
  answer, refuses our credential or drains takes no new run.
- Placement: a root run goes to the less busy of two runners drawn at random among those
  that take runs (busy: calls running and waiting per place, as the runner last said, or
  as this process counts its own runs since). A run nested under a call goes to the
  runner of the call's root run, whose cgroup slot and audit quota it shares.
- Failover: a run that never started on a runner (unreachable, draining) is placed on
  another; once it started, a runner that dies or disconnects makes it ``infra`` (not
  counted against the tool).
- Fairness: each runner's sandboxes share their places between workspaces (sandbox/fair.py)
  across every API process that sends them runs.
- Analyses of tool code are placed as root runs; one that a runner could not take, or that
  it went away before answering, is asked of another (an analysis is a pure function of
  its text, so asking again is safe).
"""

from __future__ import annotations

import ipaddress
import logging
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from toolkiln.domain.execution import RunLink, RunOutcome, RunRequest, unavailable_runtime
from toolkiln.runners import wire
from toolkiln.runners.client import NotStarted, RunnerClient, infra, start_of

log = logging.getLogger("toolkiln.runners")
CHECK_S = 1.0
RESOLVE_S = 10.0
DESCRIBE_S = 1.0  # how long a runner's description is used before it is asked again


@dataclass(frozen=True, slots=True)
class RemoteShare:
    """A call's resource share on a runner (``ResourceShare.group`` on the API's side): the
    id the runner knows it by, and the runner its root run went to."""

    id: str
    runner: RunnerClient


def _addresses(target: str) -> list[str]:
    """``target`` as gRPC addresses: a Unix socket or an IP as it is, a name resolved to
    every address it has (empty if it does not resolve now)."""
    if target.startswith("unix:"):
        return [target]
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        return [target]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return []
    out = []
    for family, _, _, _, addr in found:
        ip = str(addr[0])
        name = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if name not in out:
            out.append(name)
    return out


class Fleet:
    def __init__(
        self,
        targets: list[str],
        token: str,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        watch: bool = True,
    ) -> None:
        self.targets = targets
        self._token = token
        self._credentials = credentials
        self._runners: dict[str, RunnerClient] = {}
        self._retired: list[RunnerClient] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._resolved = 0.0
        self._described: dict[str, tuple[float, dict[str, Any]]] = {}
        self._describing = threading.Lock()  # one asker at a time
        self._side = ThreadPoolExecutor(2, thread_name_prefix="toolkiln-fleet")
        self.refresh()
        self._watcher: threading.Thread | None = None
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="runner-watch", daemon=True)
            self._watcher.start()

    # --- discovery and health

    def refresh(self) -> None:
        """Resolve the targets if due, and ask every runner how it is."""
        now = time.monotonic()
        if now - self._resolved >= RESOLVE_S or not self._runners:
            self._resolve()
            self._resolved = now
        for runner in self.runners():
            runner.check()
        with self._changed:
            self._changed.notify_all()

    def _resolve(self) -> None:
        wanted = [a for t in self.targets for a in _addresses(t)]
        with self._lock:
            for address in wanted:
                if address not in self._runners:
                    self._runners[address] = RunnerClient(address, self._token, self._credentials)
            for address in list(self._runners):
                if address not in wanted:  # gone from DNS: closed once its runs have ended
                    self._retired.append(self._runners.pop(address))
            keep = []
            for runner in self._retired:
                if runner.mine:
                    keep.append(runner)
                else:
                    runner.close()
            self._retired = keep

    def _watch(self) -> None:
        while not self._closed.wait(CHECK_S):
            try:
                self.refresh()
            except Exception:  # the watcher outlives any one failure
                log.exception("checking the runners failed")

    def runners(self) -> list[RunnerClient]:
        with self._lock:
            return list(self._runners.values())

    def status(self) -> list[dict[str, Any]]:
        """For /healthz and /metrics: each runner's address, state, places and load."""
        return [
            {
                "address": r.address,
                "state": r.state,
                "places": r.places,
                "in_flight": r.in_flight,
                "waiting": r.waiting,
                "runs": r.runs,
                "analyses": r.analyses,
                "queue_wait_s": round(r.waited_s, 6),
                "waits": list(r.waits),
                "paths": dict(r.paths),
            }
            for r in self.runners()
        ]

    def ready(self) -> bool:
        return any(r.usable for r in self.runners())

    # --- placement

    def pick(self, tried: set[str]) -> RunnerClient | None:
        """The less busy of two usable runners drawn at random (one if only one is)."""
        usable = [r for r in self.runners() if r.usable and r.address not in tried]
        if len(usable) <= 1:
            return usable[0] if usable else None
        a, b = random.sample(usable, 2)
        return a if a.load() <= b.load() else b

    def run(self, req: RunRequest, link: RunLink) -> RunOutcome:
        begun = time.perf_counter()
        deadline = time.monotonic() + req.timeout_ms / 1000
        if req.not_after is not None:
            deadline = min(deadline, req.not_after)
        share = req.share
        group = share.group if share is not None else None
        # Admitted as it is sent; the runner asks again if the run has to wait there.
        if not link.admit():
            return RunOutcome("not_admitted")
        if isinstance(group, RemoteShare):  # nested: on its call's runner, or not at all
            try:
                return group.runner.run(start_of(req, group.id, True), link)
            except NotStarted:
                return infra("The runner of the calling tool's run is gone.", begun)
        key = secrets.token_hex(16)
        tried: set[str] = set()
        again: wire.Start | None = None
        while True:
            runner = self.pick(tried)
            if runner is None:
                if not self._wait_for_runner(tried, deadline):
                    return infra("No runner can take the call.", begun)
                continue
            if share is not None:
                share.group = RemoteShare(key, runner)
            try:
                return runner.run(again or start_of(req, key, True), link)
            except NotStarted as exc:
                again = exc.again or again
                tried.add(runner.address)
                self._side.submit(runner.check)  # its state is learned now, not next second

    def analyse(self, ask: wire.Analyse, wait_s: float, timeout_s: float) -> wire.Analysed | None:
        """``ask`` answered by a usable runner (placed as a root run, asked of another when
        one could not take it or went away before answering); None when no runner took it
        within ``wait_s``. ``timeout_s``: one runner's time to answer. A runner's other
        failures and answers outside the protocol are raised (``grpc.RpcError``,
        ``wire.WireError``)."""
        deadline = time.monotonic() + wait_s
        tried: set[str] = set()
        while True:
            runner = self.pick(tried)
            if runner is None:
                if not self._wait_for_runner(tried, deadline):
                    return None
                continue
            try:
                return runner.analyse(ask, timeout_s)
            except NotStarted:
                tried.add(runner.address)
                self._side.submit(runner.check)

    def _wait_for_runner(self, tried: set[str], deadline: float) -> bool:
        """Wait (within the run's time) for a runner not tried yet to take runs; once every
        runner was tried, one more round is allowed after the next check."""
        with self._changed:
            while not self._closed.is_set():
                if any(r.usable and r.address not in tried for r in self._runners.values()):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if tried and all(a in tried for a in self._runners):
                    tried.clear()  # a runner may be back: each is tried again
                self._changed.wait(min(left, CHECK_S))
        return False

    # --- the rest of the CodeRunner port

    def describe(self, language: str) -> dict[str, Any]:
        """What a usable runner says of ``language``. An answer older than ``DESCRIBE_S`` is
        still given while one thread asks again (so callers never queue behind a slow
        runner); only the first answer is waited for, by one asker at a time. A runner that
        does not answer leaves the last answer in place, marked not ready; with none ever
        had, the shape of an unavailable runtime. Guarded by tests/runners/test_fleet.py."""
        kept = self._described.get(language)
        if kept is not None:
            if time.monotonic() - kept[0] >= DESCRIBE_S and self._describing.acquire(False):
                try:
                    self._side.submit(self._describe_now, language)
                except RuntimeError:  # closed
                    self._describing.release()
            return kept[1]
        with self._describing:
            if language not in self._described:
                self._ask(language)
        return self._described[language][1]

    def _describe_now(self, language: str) -> None:
        try:
            self._ask(language)
        finally:
            self._describing.release()

    def _ask(self, language: str) -> None:
        """Ask the usable runners in turn until one describes ``language``."""
        now = time.monotonic()
        for runner in self.runners():
            if not runner.usable:
                continue
            try:
                described = runner.describe()
            except (grpc.RpcError, ValueError):
                continue
            for name, value in described.items():
                if isinstance(value, dict):
                    self._described[name] = (now, value)
            if language in self._described and self._described[language][0] == now:
                return
        why = {"degraded": True, "reason": "no runner can take calls"}
        kept = self._described.get(language)
        shown = {**kept[1], "ready": False} if kept is not None else unavailable_runtime()
        self._described[language] = (now, {**shown, "pool": why})

    def prepare(self, language: str, imports: Sequence[str]) -> None:
        """Every usable runner starts installing the listed packages among ``imports``."""
        for runner in self.runners():
            if runner.usable:
                self._side.submit(_quietly, runner.prepare, language, list(imports))

    def close(self) -> None:
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        self._side.shutdown(wait=False, cancel_futures=True)
        for runner in self.runners() + self._retired:
            runner.close()


def _quietly(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except grpc.RpcError:
        pass  # a package a runner could not install fails that runner's calls


class RemoteRunner:
    """The ``CodeRunner`` of one language, on the fleet's runners."""

    def __init__(self, language: str, fleet: Fleet) -> None:
        self.language = language
        self.fleet = fleet

    def run(self, req: RunRequest, link: RunLink) -> RunOutcome:
        return self.fleet.run(req, link)

    def prepare(self, imports: Sequence[str]) -> None:
        self.fleet.prepare(self.language, imports)

    def describe(self) -> dict[str, Any]:
        return self.fleet.describe(self.language)
