"""What a runner process holds: its sandboxes, its code checkers, the resource shares of the
calls running on it, and whether it takes new runs and analyses (it drains on SIGTERM). No
credential of any kind: the API processes that connect bring each run's code and answer
its ctx calls."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.domain.execution import ResourceShare
from toolkiln.sandbox.checks import CheckerPool
from toolkiln.sandbox.runner import Sandbox

SERVING, DRAINING = "serving", "draining"
IDLE_SHARES = 4096
# Analyses under way at once (running, or waiting up to 10 s for one of the few checkers):
# beyond, refused as busy, so that a flood of checks from many workspaces holds no more of
# the server's threads than this, and runs keep theirs (tests/runners/test_host.py).
MAX_ANALYSING = 64


class RunnerHost:
    def __init__(self, sandboxes: dict[str, Sandbox], checks: CheckerPool) -> None:
        self.sandboxes = sandboxes
        self.checks = checks
        self.state = SERVING
        self.in_flight = 0
        self.analysing = 0  # analyses under way
        self.analyses = 0  # analyses made
        self.started = 0  # runs admitted here (a run killed after this was under way)
        # Every run of one call names the same share: the root run's cgroup slot and the
        # call's audit quota are shared with the runs nested under it (sandbox/shares.py),
        # and with its later runs (a generation's examples, one after another), as the API's
        # own ResourceShare was in-process. Kept while a run of the call is here, and then
        # among the last IDLE_SHARES idle ones; ids are the API's, and unguessable.
        self._shares: OrderedDict[str, tuple[ResourceShare, int]] = OrderedDict()
        self._idle = 0  # shares no run holds now
        self._cond = threading.Condition()

    def enter(self, share: str) -> ResourceShare | None:
        """One run arrives: the call's share, or None once the runner drains (the run is
        refused before it starts, so the API places it elsewhere). ``leave`` when it ends."""
        with self._cond:
            if self.state != SERVING:
                return None
            self.in_flight += 1
            held, count = self._shares.pop(share, (None, 0))
            if held is None:
                held = ResourceShare()
            elif count == 0:
                self._idle -= 1
            self._shares[share] = (held, count + 1)
            return held

    def admitted(self) -> None:
        """A run was admitted: its process has its code next."""
        with self._cond:
            self.started += 1

    def leave(self, share: str) -> None:
        with self._cond:
            self.in_flight -= 1
            held, count = self._shares.pop(share)
            self._shares[share] = (held, count - 1)  # the most recently used last
            if count == 1:
                self._idle += 1
            while self._idle > IDLE_SHARES:  # the oldest idle share goes (found first)
                oldest = next(k for k, (_, n) in self._shares.items() if n == 0)
                del self._shares[oldest]
                self._idle -= 1
            self._cond.notify_all()

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis | None:
        """The code checkers' analysis (``CheckerPool.analyse``: its refusals raised), or
        None once the runner drains (the API asks another runner). ``ServiceUnavailable``
        past ``MAX_ANALYSING``."""
        with self._cond:
            if self.state != SERVING:
                return None
            if self.analysing >= MAX_ANALYSING:
                raise ServiceUnavailable("Every code checker is busy; try again shortly.")
            self.analysing += 1
        try:
            return self.checks.analyse(language, code, workspace_id)
        finally:
            with self._cond:
                self.analysing -= 1
                self.analyses += 1
                self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Take no new run or analysis; wait for those under way to end. Whether they all
        did."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self.state = DRAINING
            while self.in_flight or self.analysing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def health(self) -> dict[str, Any]:
        """For the API's placement and /healthz: state, places, calls running and waiting."""
        languages = {name: box.load() for name, box in self.sandboxes.items()}
        degraded = [name for name, box in self.sandboxes.items() if box.pool_health()["degraded"]]
        state = self.state
        if state == SERVING and degraded:
            state = "degraded"
        return {
            "state": state,
            "places": sum(load["places"] for load in languages.values()),
            "in_flight": self.in_flight,
            "waiting": sum(load["waiting"] for load in languages.values()),
            "analyses": self.analyses,
            "started": self.started,
            "languages": languages,
        }

    def close(self) -> None:
        self.checks.close()
        for sandbox in self.sandboxes.values():
            sandbox.close()
