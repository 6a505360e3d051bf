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


def test_a_call_nesting_javascript_cannot_take_another_workspaces_last_worker(
    pair: Pair,
) -> None:
    """A's tool nests a spinning JavaScript tool: the nested run waits (A holds its share),
    B's call gets the other worker, and neither of A's tools is failed for the wait."""
    a, b = pair.a, pair.b
    inner = a.tool("spin-nested", SPIN, timeout_ms=1000)
    nester = a.tool(
        "nester",
        "async function main(p, ctx) { const r = await ctx.tools['spin-nested']({});"
        " return { message: String(r.error) } }",
        timeout_ms=5000,
    )
    quick = b.tool("quick-b", QUICK, timeout_ms=2000)
    fair = pair.runtime.sandboxes["javascript"].fair
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(a.invoke(nester)))
    t.start()
    wait_for(lambda: fair.held.get(a.workspace_id) == 1 and fair.waiting() == 1, "A nested")
    got = b.invoke(quick, {"n": 2})
    assert got["status"] == "ok" and got["message"] == "b-2", got
    t.join(timeout=30)
    assert out["status"] == "ok" and out["message"] == "timeout", out
    assert a.get_tool(inner)["failure_count"] == 0 and a.get_tool(nester)["failure_count"] == 0


def test_a_tool_may_call_a_tool_while_its_workspace_has_a_place_left(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data_dir = tmp_path_factory.mktemp("fair-nesting")
    with own_service(data_dir, TOKEN, sandbox_js_workers=3) as (rt, client, _):
        a = tenant(rt, client, "nesting")
        a.tool("inner", "function main(p) { return { message: 'inner' } }")
        outer = a.tool(
            "outer",
            "async function main(p, ctx) { const r = await ctx.tools.inner({});"
            " return { message: 'outer+' + r.message } }",
        )
        got = a.invoke(outer)
        assert got["status"] == "ok" and got["message"] == "outer+inner", got


BUSY = (
    "function main(p) { const t = Date.now(); while (Date.now() - t < 600) {} "
    "return { message: 'ran' } }"
)


def test_a_call_queued_for_a_worker_when_its_tool_is_disabled_is_not_run(pair: Pair) -> None:
    """CONTRACT 4: the status is decided when the run starts. The second call queues for a
    worker (its workspace holds its share), the tool is disabled meanwhile: the call that
    was running ends as it would (usage only), the queued one is ``tool_disabled``, unrun."""
    a = pair.a
    fair = pair.runtime.sandboxes["javascript"].fair
    busy = a.tool("busy-then-disabled", BUSY, timeout_ms=5000)
    results: dict[str, dict] = {}
    first = threading.Thread(target=lambda: results.setdefault("first", a.invoke(busy)))
    first.start()
    wait_for(lambda: fair.held.get(a.workspace_id) == 1, "the first call runs")
    second = threading.Thread(target=lambda: results.setdefault("second", a.invoke(busy)))
    second.start()
    wait_for(lambda: fair.waiting() == 1, "the second call queues")
    r = a.client.post(f"/v1/custom-tools/{busy}/disable", headers=a.headers)
    assert r.status_code == 200, r.text
    first.join(timeout=30)
    second.join(timeout=30)
    assert results["first"]["status"] == "ok", results
    assert results["second"]["error"]["code"] == "tool_disabled", results
    after = a.get_tool(busy)
    assert after["usage_count"] == 1 and after["failure_count"] == 0, after
