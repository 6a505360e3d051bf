"""Text that is not valid Unicode (lone surrogates such as "\\ud800"), sent by tool code in
every field the jail reports, must never make a call vanish or turn into an uncounted
``infra_error``: the host repairs or refuses it at the boundary and decides the outcome."""

from __future__ import annotations

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

LANGUAGES = ["python", "javascript"]

CODE = {
    ("audit-event", "python"): (
        "async def main(*, ctx, **p):\n"
        "    ctx.audit('ev\\ud800', {'k\\udfff': 'v\\ud800'})\n"
        "    return {'message': 'audited'}\n"
    ),
    ("audit-event", "javascript"): (
        "async function main(p, ctx) {\n"
        "  await ctx.audit('ev\\ud800', { ['k\\udfff']: 'v\\ud800' });\n"
        "  return { message: 'audited' };\n"
        "}\n"
    ),
    ("tool-name", "python"): (
        "def handle(input, ctx):\n    return ctx.tools['calc\\ud800']({'s': '\\udfff'})\n"
    ),
    ("tool-name", "javascript"): (
        "async function handle(input, ctx) { return await ctx.tools['calc\\ud800']({ s: '\\udfff' }) }"
    ),
    ("exception-type", "python"): (
        # CPython refuses a class name it cannot encode: the message carries the bad text.
        "def handle(input, ctx):\n    raise ValueError('boom \\udfff')\n    return 1\n"
    ),
    ("exception-type", "javascript"): (
        "function handle(p) { const e = new Error('boom \\udfff'); e.name = 'Bad\\ud800'; throw e; return 1 }"
    ),
    ("result-value", "python"): (
        "def main(**p):\n    return {'message': 'm', 'rawData': {'k': 'v\\ud800'}}\n"
    ),
    ("result-value", "javascript"): (
        "function main(p) { return { message: 'm', rawData: { k: 'v\\ud800' } } }"
    ),
    ("result-key", "python"): ("def handle(input, ctx):\n    return {'\\udc80': 1}\n"),
    ("result-key", "javascript"): ("function handle(input) { return { ['\\udc80']: 1 } }"),
    ("logs", "python"): (
        "import sys\n"
        "def main(**p):\n"
        "    print('out\\ud800')\n"
        "    sys.stderr.write('err\\udfff')\n"
        "    return {'message': 'logged'}\n"
    ),
    ("logs", "javascript"): (
        "function main(p) { console.log('out\\ud800'); console.error('err\\udfff');"
        " return { message: 'logged' } }"
    ),
}


@pytest.fixture(scope="module")
def tenant_t(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "text-boundary")


def _invoke(t: Tenant, case: str, language: str) -> tuple[dict, dict, dict]:
    tool_id = t.tool(f"{case}-{language}", CODE[(case, language)], language=language)
    res = t.invoke(tool_id)
    stored = t.stored(res["tool_call_id"])  # the call was recorded
    assert "\\ud800" not in str(res) and "\ud800" not in str(res)
    return res, stored, t.get_tool(tool_id)


@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_an_audit_row_is_repaired(tenant_t: Tenant, language: str) -> None:
    res, stored, tool = _invoke(tenant_t, "audit-event", language)
    assert res["status"] == "ok", res
    rows = {row["event"]: row for row in stored["audit"]}
    assert "tool.invoked" in rows
    assert "custom.ev\ufffd" in rows, rows
    assert tool["failure_count"] == 0


@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_a_ctx_tool_name_is_an_unknown_tool(tenant_t: Tenant, language: str) -> None:
    res, _, _ = _invoke(tenant_t, "tool-name", language)
    assert res["status"] == "ok", res
    assert res["raw_data"]["error"] == "unknown_tool", res


@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_an_exception_is_a_counted_runtime_error(
    tenant_t: Tenant, language: str
) -> None:
    res, stored, tool = _invoke(tenant_t, "exception-type", language)
    assert res["error"]["code"] == "runtime_error", res
    assert (
        res["error"]["details"]["type"]
        == {"python": "ValueError", "javascript": "Bad\ufffd"}[language]
    )
    assert res["error"]["details"]["message"] == "boom \ufffd", res
    assert stored["status"] == "error" and tool["failure_count"] == 1


@pytest.mark.parametrize("case", ["result-value", "result-key"])
@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_a_result_is_a_counted_invalid_result(
    tenant_t: Tenant, language: str, case: str
) -> None:
    res, stored, tool = _invoke(tenant_t, case, language)
    assert res["error"]["code"] == "invalid_result", res
    assert "Unicode" in res["error"]["message"] or "not JSON" in res["error"]["message"]
    assert stored["status"] == "error" and tool["failure_count"] == 1


@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_the_logs_is_repaired(tenant_t: Tenant, language: str) -> None:
    res, _, tool = _invoke(tenant_t, "logs", language)
    assert res["status"] == "ok", res
    assert res["logs"]["stdout"].startswith("out") and res["logs"]["stderr"].startswith("err")
    assert tool["failure_count"] == 0


@pytest.mark.parametrize("language", LANGUAGES)
def test_bad_text_in_an_api_input_reaches_the_code_repaired(
    tenant_t: Tenant, language: str
) -> None:
    code = {
        "python": "def handle(input, ctx):\n    return input['s']\n",
        "javascript": "function handle(input) { return input.s }",
    }[language]
    tool_id = tenant_t.tool(f"echo-{language}", code, language=language)
    r = tenant_t.client.post(
        f"/v1/custom-tools/{tool_id}/invoke",
        content=b'{"input": {"s": "x\\ud800"}}',
        headers={**tenant_t.headers, "Content-Type": "application/json"},
    )
    # Refused at the API with the field named, or repaired before it reaches the jail.
    assert r.status_code in {200, 400, 422}, r.text
    if r.status_code == 200:
        res = r.json()["data"]
        refused = res["status"] == "error" and res["error"]["code"] == "invalid_input"
        assert refused or (res["status"] == "ok" and res["raw_data"] == "x\ufffd"), res
