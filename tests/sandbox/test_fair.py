"""Fair shares between workspaces: the queue, the per-workspace cap, and a Python sandbox
whose processes one workspace cannot all hold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.sandbox.links import NoCtx
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.sandbox.fair import FairShare
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.runner import Limits, Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def wait_for(condition, what: str) -> None:
    deadline = soon(10)
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_workspace_holds_at_most_all_but_one() -> None:
    fair = FairShare(3)
    assert fair.acquire("a", soon()) and fair.acquire("a", soon())
    assert not fair.acquire("a", time.monotonic() + 0.05)  # its cap, not the pool's
    assert fair.acquire("b", soon())  # the last one is another workspace's
    assert fair.acquire("b", time.monotonic() + 0.05) is False  # all taken now


def test_nested_runs_count_toward_their_workspaces_share() -> None:
    """A call nesting a run cannot take another workspace's last place with it."""
    fair = FairShare(2)
    assert fair.acquire("a", soon())  # a root call
    assert not fair.acquire("a", time.monotonic() + 0.05)  # the run it nests waits...
    assert fair.acquire("b", soon())  # ...and another workspace still gets its place
    assert fair.busy == 2 and fair.held == {"a": 1, "b": 1}


def test_the_next_free_worker_goes_to_the_workspace_holding_fewest() -> None:
    fair = FairShare(3)
    assert fair.acquire("a", soon())
    assert fair.acquire("b", soon())
    assert fair.acquire("x", soon())
    order: list[str] = []

    def wait(ws: str) -> None:
        if fair.acquire(ws, soon()):
            order.append(ws)

    first = threading.Thread(target=wait, args=("a",))  # queued first, but A holds one
    first.start()
    wait_for(lambda: fair.waiting() == 1, "a queued")
    second = threading.Thread(target=wait, args=("c",))
    second.start()
    wait_for(lambda: fair.waiting() == 2, "c queued")
    fair.release("b")
    wait_for(lambda: order == ["c"], "c served first")
    fair.release("c")
    first.join(5)
    second.join(5)
    assert order == ["c", "a"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(
        PackageStore(tmp_path_factory.mktemp("pkgs")),
        warm=2,
        limits=Limits(concurrent_calls=2),
        name="fair",
    )
    yield sb
    sb.close()


def test_one_workspace_cannot_hold_every_python_process(small: Sandbox) -> None:
    slow = "import time\ndef handle(i, c):\n    time.sleep(1.0)\n    return 'a'\n"
    quick = "def handle(i, c):\n    return 'b'\n"
    results: list[RunOutcome] = []

    def a_call() -> None:
        results.append(
            small.run(RunRequest("python", slow, "handle", {}, 8000, workspace_id="a"), NoCtx())
        )

    threads = [threading.Thread(target=a_call) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: small.fair.held.get("a") == 1 and small.fair.waiting() == 2, "A queued")
    b = small.run(RunRequest("python", quick, "handle", {}, 1000, workspace_id="b"), NoCtx())
    assert b.kind == "return" and b.value == "b", (b.kind, b.message)
    for t in threads:
        t.join(30)
    assert sorted(r.kind for r in results) == ["return", "return", "return"]
    assert small.describe()["limits"]["concurrent_calls_per_workspace"] == 1
