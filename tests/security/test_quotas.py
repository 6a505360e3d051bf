"""Quotas hold per call, across everything nested under it, and between workspaces."""

from __future__ import annotations

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
