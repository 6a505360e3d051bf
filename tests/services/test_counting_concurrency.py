"""Counting is exact under concurrency: atomic UPDATEs, on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.conftest import Space
from toolkiln.app import Runtime
from toolkiln.domain.records import AuditFilter
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.calls import CallContext


def _tool(runtime: Runtime, space: Space, code: str, name: str):
    who = runtime.services.access.authenticate(space.tokens["invoke,read,write"])
    draft = ToolDraft.of(name=name, language="python", code=code, input_schema={"type": "object"})
    return who, runtime.services.tools.create(who, space.id, draft)


def test_parallel_invocations_keep_usage_count_exact(runtime: Runtime, space: Space) -> None:
    who, tool = _tool(runtime, space, "def main(**p):\n    return {'message': 'ok'}", "count")
    n = 200
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(
                lambda _: runtime.services.invoke.invoke(who, tool.id, {}, CallContext()), range(n)
            )
        )
    assert [r.status for r in results] == ["ok"] * n
    after = runtime.services.tools.get(who, tool.id)
    assert after.usage_count == n and after.failure_count == 0


def test_parallel_failures_disable_exactly_once(runtime: Runtime, space: Space) -> None:
    who, tool = _tool(
        runtime, space, "def main(**p):\n    raise ValueError('x')\n    return {}", "fail"
    )
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(
                lambda _: runtime.services.invoke.invoke(who, tool.id, {}, CallContext()), range(40)
            )
        )
    codes = [r.error["code"] for r in results if r.error]
    executed = codes.count("runtime_error")
    assert executed >= 3 and executed + codes.count("tool_disabled") == 40
    after = runtime.services.tools.get(who, tool.id)
    assert after.status == "disabled"
    # The failures that were already running when the tool was disabled count as usage;
    # the consecutive-failure count stops at the one that disabled it.
    assert after.usage_count == executed and after.failure_count == 3
    page = runtime.services.audit.page(
        who, AuditFilter(tool_id=tool.id, event="tool.disabled"), None, 100
    )
    assert len(page.items) == 1
    assert page.items[0].data["reason"] == "automatic, after 3 consecutive failures"
