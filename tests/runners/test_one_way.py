"""One-way runs (runners/wire.py ``RunOneWay``): code the analysis says is given no ctx runs
as one unary call; a run that would wait for its place, or whose code makes a ctx call
anyway, goes on the stream instead, with its admission asked again; a stream run that
waited behind a one-way run is admitted only once the API has noted that run's end.

A real gRPC runner server on loopback, with a sandbox that keeps the real fair queue and
calls the link as the real one does (admit, ctx calls, ended)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from toolkiln.api.runner_metrics import RunnerMetrics
from toolkiln.domain.code_check import analyse
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.domain.fair import FairShare
from toolkiln.runners import server as server_module
from toolkiln.runners.client import RunnerClient, start_of
from toolkiln.runners.fleet import Fleet
from toolkiln.runners.server import RunnerService, make_server

TOKEN = "one-way-token"


class Sandbox:
    """Takes its turn in a real fair queue, then admits, makes ``input["ctx"]`` ctx calls,
    waits for ``input["gate"]`` (a name in ``gates``) if given, and ends."""

    def __init__(self, places: int) -> None:
        self.fair = FairShare(places)
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.links: list[str] = []  # the kind of link of each run that got a place

    def at_once(self, req: RunRequest) -> bool:
        return self.fair.at_once(req.workspace_id)

    def run(self, req: RunRequest, link: Any) -> RunOutcome:
        if not self.fair.acquire(req.workspace_id, time.monotonic() + 10):
            return RunOutcome("timeout")
        try:
            self.links.append(type(link).__name__)
            if not link.admit():
                return RunOutcome("not_admitted")
            gate = req.input.get("gate")
            if gate:
                self.entered[gate].set()
                self.gates[gate].wait(10)
            got = [link.call("calculate", {"n": n}) for n in range(req.input.get("ctx", 0))]
            link.ended()
            return RunOutcome("return", value={"got": got})
        finally:
            self.fair.release(req.workspace_id)


class Host:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandboxes = {"python": sandbox}
        self.started = 0

    def enter(self, share: str) -> object:
        return object()

    def leave(self, share: str) -> None:
        pass

    def admitted(self) -> None:
        self.started += 1


class Link:
    """The API's side of one run: what happened, in order, in ``log`` (shared)."""

    def __init__(self, name: str, log: list[str], ended_s: float = 0.0) -> None:
        self.name, self.log, self.ended_s = name, log, ended_s

    def admit(self) -> bool:
        self.log.append(f"{self.name} admitted")
        return True

    def call(self, name: str, payload: Any) -> Any:
        return payload["n"] * 2

    def audit(self, event: str, data: Any) -> str | None:
        return None

    def ended(self) -> None:
        time.sleep(self.ended_s)  # the API noting the end (its record) takes a while
        self.log.append(f"{self.name} ended")


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sandbox, Host, RunnerClient]]:
    # A run that got its place at once keeps the API's admission however busy the machine
    # (the window itself: tests/runners/test_topology.py and the sandbox's tests).
    monkeypatch.setattr(server_module, "ADMIT_FRESH_S", 60.0)
    sandbox = Sandbox(places=1)
    host = Host(sandbox)
    service = RunnerService(host)  # type: ignore[arg-type]
    server, port = make_server(service, "127.0.0.1:0", TOKEN)
    client = RunnerClient(f"127.0.0.1:{port}", TOKEN)
    yield sandbox, host, client
    client.close()
    server.stop(None)
    service.close()


def request(one_way: bool, workspace: str = "w", **given: Any) -> RunRequest:
    return RunRequest("python", "", "main", given, 5000, workspace_id=workspace, one_way=one_way)


def test_code_given_no_ctx_runs_one_way_and_other_code_on_the_stream(
    runner: tuple[Sandbox, Host, RunnerClient],
) -> None:
    sandbox, host, given = runner
    fleet = Fleet([given.address], TOKEN, watch=False)  # the API's own client of the runner
    try:
        (client,) = fleet.runners()
        log: list[str] = []
        outcome = client.run(start_of(request(True), "s1", True), Link("a", log))
        assert outcome.kind == "return" and outcome.value == {"got": []}
        outcome = client.run(start_of(request(False, ctx=2), "s2", True), Link("b", log))
        assert outcome.kind == "return" and outcome.value == {"got": [0, 2]}
        assert sandbox.links == ["OneWayLink", "StreamLink"]
        # A one-way run admitted as sent is not asked again; its end is noted, as a stream's.
        assert log == ["a ended", "b ended"]
        assert host.started == 2 and client.runs == 2
        # How each went, on /metrics: the API's collector over the fleet's status.
        assert client.paths == {"one_way": 1, "stream": 1}
        registry = CollectorRegistry()
        registry.register(RunnerMetrics(fleet.status))
        shown = generate_latest(registry).decode()
        for path in ("one_way", "stream"):
            line = f'toolkiln_runner_run_paths_total{{path="{path}",runner="{client.address}"}}'
            assert f"{line} 1.0" in shown, shown
    finally:
        fleet.close()


def test_a_one_way_run_whose_code_calls_ctx_is_run_again_on_the_stream(
    runner: tuple[Sandbox, Host, RunnerClient],
) -> None:
    sandbox, _, client = runner
    log: list[str] = []
    outcome = client.run(start_of(request(True, ctx=1), "s", True), Link("a", log))
    assert outcome.kind == "return" and outcome.value == {"got": [0]}
    assert sandbox.links == ["OneWayLink", "StreamLink"]
    # Given up at its first ctx call, it ran again from the start, its admission asked.
    assert log == ["a admitted", "a ended"]
    assert client.paths == {"ctx": 1}


def test_a_one_way_run_whose_process_was_late_is_admitted_again_before_each_later_try(
    runner: tuple[Sandbox, Host, RunnerClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process ready only after the window (here: always) voids the API's admission: the
    API admits the run again and sends it one way once more, then on the stream, which
    asks."""
    monkeypatch.setattr(server_module, "ADMIT_FRESH_S", 0.0)
    sandbox, host, client = runner
    log: list[str] = []
    outcome = client.run(start_of(request(True), "s", True), Link("a", log))
    assert outcome.kind == "return"
    assert sandbox.links == ["OneWayLink", "OneWayLink", "StreamLink"]
    assert log == ["a admitted", "a admitted", "a ended"] and host.started == 1
    assert client.paths == {"wait": 2}  # two round trips more, each after a status re-read


def test_a_one_way_run_that_would_wait_goes_on_the_stream_and_is_admitted_after_the_run_before(
    runner: tuple[Sandbox, Host, RunnerClient],
) -> None:
    """The first run holds the one place; the second, sent one way, is declined (it would
    wait), and waits on the stream; the first ends while it waits, and the second is
    admitted only after the API has noted that end (``Started.after``), slow as the noting
    is."""
    sandbox, _, client = runner
    sandbox.gates["hold"], sandbox.entered["hold"] = threading.Event(), threading.Event()
    log: list[str] = []
    results: dict[str, RunOutcome] = {}

    def first() -> None:
        start = start_of(request(True, "w1", gate="hold"), "s1", True)
        results["first"] = client.run(start, Link("first", log, ended_s=0.3))

    thread = threading.Thread(target=first)
    thread.start()
    assert sandbox.entered["hold"].wait(10)
    second = threading.Thread(
        target=lambda: results.setdefault(
            "second", client.run(start_of(request(True, "w2"), "s2", True), Link("second", log))
        )
    )
    second.start()
    while not sandbox.fair.waiting():  # the second waits for the place on its stream
        time.sleep(0.01)
    sandbox.gates["hold"].set()
    thread.join(10)
    second.join(10)
    assert results["first"].kind == "return" and results["second"].kind == "return"
    assert sandbox.links == ["OneWayLink", "StreamLink"]
    assert log == ["first ended", "second admitted", "second ended"]
    assert client.paths == {"one_way": 1, "busy": 1}


@pytest.mark.parametrize(
    ("language", "code", "takes_ctx"),
    [
        ("javascript", "function main(params) { return { message: 'ok' } }", False),
        ("javascript", "const main = p => p", False),
        ("javascript", "function main(p, c) { return c }", True),
        ("javascript", "function main(...a) { return a }", True),
        ("javascript", "function main(p) { return arguments[1] }", True),
        ("javascript", "function main(p) { return this }", True),
        ("javascript", "function main(p) { return 1 }\nmain = (a, b) => b", True),
        ("javascript", "function main(p) { return globalThis }", True),
        ("javascript", "function handle(input, c) { return 1 }", True),
        ("python", "def main(**params):\n    return {'message': 'ok'}\n", False),
        ("python", "import time\ndef main(s):\n    time.sleep(s)\n    return 1\n", False),
        ("python", "def main(*, ctx, **p):\n    return 1\n", True),
        ("python", "def handle(input, c):\n    return 1\n", True),
        ("python", "def main():\n    return 1\nmain = lambda *, ctx: 1\n", True),
        ("python", "import functools\n@functools.cache\ndef main():\n    return 1\n", True),
        ("python", "import sys\ndef main():\n    return sys._getframe(1)\n", True),
        ("python", "def main():\n    return globals()\n", True),
        ("python", "def main():\n    return 'ctx'\n", True),
        ("python", "from x import main as m\ndef main():\n    return m\n", True),
    ],
)
def test_only_code_whose_entrypoint_is_never_given_ctx_may_run_one_way(
    language: str, code: str, takes_ctx: bool
) -> None:
    found = analyse(language, code)
    assert not found.problems and found.takes_ctx is takes_ctx
