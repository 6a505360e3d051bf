"""Quotas hold per call, across everything nested under it, and between workspaces."""

from __future__ import annotations

import json

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

INNER = (
    "def handle(input, ctx):\n"
    "    held = bytearray(input['mb'] * 1024 * 1024)\n"
    "    for i in range(0, len(held), 4096):\n"
    "        held[i] = 1\n"
    "    return len(held)\n"
)
HOLD = {
    "python": (
        "def handle(input, ctx):\n"
        "    held = bytearray(input['mb'] * 1024 * 1024)\n"
        "    for i in range(0, len(held), 4096):\n"
        "        held[i] = 1\n"
        "    inner = ctx.tools.run_code({'language': 'python', 'code': input['inner'],\n"
        "                                'input': {'mb': input['mb']}})\n"
        "    return {'inner': inner, 'held': len(held)}\n"
    ),
    "javascript": (
        "async function handle(input, ctx) {\n"
        "  const held = new Uint8Array(input.mb * 1024 * 1024);\n"
        "  for (let i = 0; i < held.length; i += 4096) held[i] = 1;\n"
        "  const inner = await ctx.tools.run_code({ language: 'python', code: input.inner,\n"
        "                                           input: { mb: input.mb } });\n"
        "  return { inner, held: held.length };\n"
        "}\n"
    ),
}


@pytest.fixture(scope="module")
def t(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "quotas")


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_memory_cap_holds_for_a_call_and_its_nested_runs(
    target: Target, t: Tenant, language: str
) -> None:
    tool = t.tool(f"hold-{language}", HOLD[language], language=language, timeout_ms=10000)
    fits = t.invoke(tool, {"mb": 60, "inner": INNER})
    assert fits["status"] == "ok", fits
    assert fits["raw_data"]["inner"]["status"] == "ok", fits
    # Each half fits the 256 MB cap alone; together they do not: one of them is stopped.
    over = t.invoke(tool, {"mb": 150, "inner": INNER})
    if over["status"] == "ok":
        inner = over["raw_data"]["inner"]
        assert inner["status"] == "error" and inner["error"]["code"] == "memory_limit", over
    else:
        assert over["error"]["code"] == "memory_limit", over
    target.assert_contained()


AUDIT_FLOOD = {
    "python": (
        "async def main(*, ctx, **p):\n"
        "    for i in range(20):\n"
        "        ctx.audit('big', {'blob': 'x' * 100_000})\n"
        "    for i in range(250):\n"
        "        ctx.audit('small', {'i': i, 'pad': 'y' * 2000})\n"
        "    return {'message': 'flooded'}\n"
    ),
    "javascript": (
        "async function main(p, ctx) {\n"
        "  for (let i = 0; i < 20; i++) await ctx.audit('big', { blob: 'x'.repeat(100000) });\n"
        "  for (let i = 0; i < 250; i++) await ctx.audit('small', { i, pad: 'y'.repeat(2000) });\n"
        "  return { message: 'flooded' };\n"
        "}\n"
    ),
}


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_audit_rows_are_capped_per_call_in_count_and_bytes(t: Tenant, language: str) -> None:
    tool = t.tool(
        f"audit-flood-{language}", AUDIT_FLOOD[language], language=language, timeout_ms=10000
    )
    res = t.invoke(tool)
    assert res["status"] == "ok", res
    rows = [r for r in t.stored(res["tool_call_id"])["audit"] if r["event"].startswith("custom.")]
    assert rows and all(r["event"] == "custom.small" for r in rows)  # 100 KB rows dropped
    total = sum(len(json.dumps(r["data"])) for r in rows)
    assert len(rows) <= 200 and total <= 512 * 1024, (len(rows), total)
    assert "rows dropped" in res["logs"]["stderr"]


CTX_FLOOD = {
    "python": (
        "def handle(input, ctx):\n"
        "    for i in range(1200):\n"
        "        ctx.audit('tick', i)\n"
        "    return 'survived'\n"
    ),
    "javascript": (
        "async function handle(input, ctx) {\n"
        "  for (let i = 0; i < 1200; i++) await ctx.audit('tick', i);\n"
        "  return 'survived';\n"
        "}\n"
    ),
}


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_flood_of_ctx_frames_ends_the_run(target: Target, t: Tenant, language: str) -> None:
    tool = t.tool(f"ctx-flood-{language}", CTX_FLOOD[language], language=language)
    res = t.invoke(tool)
    assert res["status"] == "error" and res["error"]["code"] == "runtime_error", res
    assert res["error"]["details"]["type"] == "CtxLimitError"
    assert t.get_tool(tool)["failure_count"] == 1
    target.assert_contained()


WIDE_LOGS = {
    # 65,000 three-byte characters: ~190 KB of UTF-8 under a 64 KB cap counted in UTF-16
    # units (the JavaScript prelude) or in characters (the host's cut, before).
    "javascript": (
        "function main(p) {\n"
        "  console.log('\\u20ac'.repeat(65000));\n"
        "  console.error('\\u20ac'.repeat(65000));\n"
        "  return { message: 'logged' };\n"
        "}\n"
    ),
    # The same in a result frame the tool writes itself, past the jail's own capped streams.
    "python": (
        "import os, protocol\n"
        "def handle(input, ctx):\n"
        "    link, wide = ctx._link, '\\u20ac' * 65000\n"
        "    protocol.send(link.sock, {'op': 'result', 'run': link.run, 'kind': 'return',\n"
        "                              'value': 'logged', 'stdout': wide, 'stderr': wide})\n"
        "    os._exit(0)\n"
        "    return 1\n"
    ),
}


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_logs_are_capped_in_bytes(target: Target, t: Tenant, language: str) -> None:
    tool = t.tool(f"wide-logs-{language}", WIDE_LOGS[language], language=language)
    res = t.invoke(tool)
    assert res["status"] == "ok", res
    assert res["logs"]["stdout"].startswith("\u20ac" * 1000), res["logs"]["stdout"][:100]
    for stream in ("stdout", "stderr"):  # (JavaScript's two streams share one cap)
        text = res["logs"][stream]
        assert len(text.encode()) <= 64 * 1024 + 100, (stream, len(text.encode()))
    stored = t.stored(res["tool_call_id"])
    assert len(stored["logs"]["stdout"].encode()) <= 64 * 1024 + 100
    target.assert_contained()
