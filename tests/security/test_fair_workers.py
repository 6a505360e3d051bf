"""JavaScript workers are shared fairly: one workspace cannot hold them all, and a call that
waits for a worker waits within its own deadline (then ``timeout``, never ``infra_error``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import own_service
from tests.security.tenants import Tenant, tenant
from toolkiln.app import Runtime

TOKEN = "tk_fair-workers-suite-admin-token"
SPIN = "function main(p) { while (true) {} return { message: 'never' } }"
QUICK = "function main(p) { return { message: 'b-' + p.n } }"


@dataclass
class Pair:
    runtime: Runtime
    a: Tenant
    b: Tenant


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data_dir = tmp_path_factory.mktemp("fair-workers")
    with own_service(data_dir, TOKEN, sandbox_js_workers=2) as (rt, client, _):
        yield Pair(rt, tenant(rt, client, "greedy"), tenant(rt, client, "polite"))


def wait_for(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_one_workspace_cannot_hold_every_worker(pair: Pair) -> None:
    a, b = pair.a, pair.b
    fair = pair.runtime.sandboxes["javascript"].fair
    spin = a.tool("spin", SPIN, timeout_ms=1500)
    quick = b.tool("quick", QUICK, timeout_ms=1000)
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(a.invoke(spin))) for _ in range(3)]
    for t in threads:
        t.start()
    # A holds what it may (all workers but one) and its other calls queue.
    wait_for(lambda: fair.held.get(a.workspace_id) == 1 and fair.waiting() == 2, "A queued")
    got = b.invoke(quick, {"n": 1})
    assert got["status"] == "ok" and got["message"] == "b-1", got
    for t in threads:
        t.join(timeout=30)
    codes = sorted(r["error"]["code"] for r in results)
    # A's first call ran to its limit; its queued calls waited within their own deadlines.
    assert codes == ["timeout", "timeout", "timeout"], results
    assert pair.runtime.sandboxes["javascript"].fair.busy == 0


def test_nested_calls_of_a_workspace_are_not_capped_by_their_own_call(pair: Pair) -> None:
    a = pair.a
    inner = a.tool("inner", "function main(p) { return { message: 'inner' } }")
    outer = a.tool(
        "outer",
        "async function main(p, ctx) { const r = await ctx.tools.inner({});"
        " return { message: 'outer+' + r.message } }",
    )
    assert inner
    got = a.invoke(outer)
    assert got["status"] == "ok" and got["message"] == "outer+inner", got
