"""A one-way run given up at its ctx call and placed again on another runner asks for its
admission again there (docs/decisions/151)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.runners.test_one_way import TOKEN, Host, Sandbox, request
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.runners import server as server_module
from toolkiln.runners.fleet import Fleet
from toolkiln.runners.server import RunnerService, make_server


class Drains(Sandbox):
    """Its code reaches ctx in the first run of all (given up there: that run is sent again
    on the stream), and its runner starts draining at that moment."""

    tried: list[str] = []  # shared by both runners

    def __init__(self) -> None:
        super().__init__(places=1)
        self.service: RunnerService | None = None

    def run(self, req: RunRequest, link: Any) -> RunOutcome:
        if not self.fair.acquire(req.workspace_id, time.monotonic() + 10):
            return RunOutcome("timeout")
        try:
            self.links.append(type(link).__name__)
            if not link.admit():
                return RunOutcome("not_admitted")
            Drains.tried.append(type(link).__name__)
            if len(Drains.tried) == 1:
                time.sleep(0.3)  # it works a while, then reaches ctx
                assert self.service is not None
                self.service._closing = True  # the runner starts draining
                link.call("calculate", {"n": 1})
            link.ended()
            return RunOutcome("return", value={"ran": True})
        finally:
            self.fair.release(req.workspace_id)


class Disabled:
    """The API's side: the tool is active when the call arrives, disabled from then on
    (an operator, or the third failure of another call, during the first try)."""

    def __init__(self) -> None:
        self.asked = 0

    def admit(self) -> bool:
        self.asked += 1
        return self.asked == 1

    def call(self, name: str, payload: Any) -> Any:
        return 0

    def audit(self, event: str, data: Any) -> str | None:
        return None

    def ended(self) -> None:
        pass


def test_a_one_way_run_placed_again_after_its_runner_drained_reads_the_status_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given up at its ctx call, then refused by its draining runner (``NotStarted``): the
    fleet places it on the other runner as the stream rerun was (``NotStarted.again``), so
    the status is read again there and the tool, disabled meanwhile, does not run."""
    monkeypatch.setattr(server_module, "ADMIT_FRESH_S", 60.0)  # any machine's load
    Drains.tried = []
    made = []
    for _ in range(2):
        sandbox = Drains()
        service = RunnerService(Host(sandbox))  # type: ignore[arg-type]
        sandbox.service = service
        server, port = make_server(service, "127.0.0.1:0", TOKEN)
        made.append((sandbox, service, server, f"127.0.0.1:{port}"))
    fleet = Fleet([m[3] for m in made], TOKEN, watch=False)
    try:
        for r in fleet.runners():
            r.state = "serving"
        link = Disabled()
        outcome = fleet.run(request(True), link)
        assert Drains.tried[0] == "OneWayLink"
        assert outcome.kind == "not_admitted", (outcome, Drains.tried, link.asked)
    finally:
        fleet.close()
        for _, service, server, _ in made:
            server.stop(None)
            service.close()
