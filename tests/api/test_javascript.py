"""JavaScript tools through the API: the contract, the seed's examples, errors and ctx."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool


def run(
    client: TestClient, space: Space, rw, code: str, payload: dict | None = None, **over
) -> dict:
    body = seed_tool(
        space,
        language="javascript",
        code=code,
        parameters=None,
        input_schema={"type": "object"},
        input=payload or {},
        **over,
    )
    r = client.post("/v1/custom-tools/test", json=body, headers=rw)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_seed_examples_in_javascript(client: TestClient, space: Space, rw) -> None:
    currency = (
        "export async function main(params) {\n"
        "  const fmt = new Intl.NumberFormat('en-US', { style: 'currency', currency: params.currency });\n"
        "  return { message: fmt.format(params.amount) };\n"
        "}\n"
    )
    assert (
        run(client, space, rw, currency, {"amount": 1234.5, "currency": "USD"})["message"]
        == "$1,234.50"
    )
    slug = "function main(p) { return { message: p.title.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '') } }"
    assert (
        run(client, space, rw, slug, {"title": "My Blog Post Title"})["message"]
        == "my-blog-post-title"
    )
    cagr = (
        "function main({ startValue, endValue, years }) {\n"
        "  const cagr = Math.pow(endValue / startValue, 1 / years) - 1;\n"
        "  const formatted = (cagr * 100).toFixed(2) + '%';\n"
        "  return { message: formatted, rawData: { cagr: Number(cagr.toFixed(4)), formatted } };\n"
        "}\n"
    )
    res = run(client, space, rw, cagr, {"startValue": 100, "endValue": 200, "years": 5})
    assert res["raw_data"] == {"cagr": 0.1487, "formatted": "14.87%"}


def test_contract_shapes_and_ctx_fields(client: TestClient, space: Space, rw) -> None:
    handle = "export async function handle(input, ctx) { return [input.n * 2, typeof ctx.tools, ctx.toolCallId.length > 0] }"
    res = run(client, space, rw, handle, {"n": 21})
    assert (
        res["status"] == "ok"
        and res["raw_data"] == [42, "object", True]
        and res["message"] == '[42, "object", true]'
    )
    arrow = "const main = async (p) => ({ message: 'hi ' + p.who, _llm: 'L' });"
    res = run(client, space, rw, arrow, {"who": "x"})
    assert res["message"] == "hi x" and res["llm"] == "L"
    logs = "function main() { console.log('out', {a: 1}); console.error('err'); return { message: 'm' } }"
    res = run(client, space, rw, logs)
    assert res["logs"] == {"stdout": 'out {"a":1}\n', "stderr": "err\n"}
    bad = run(client, space, rw, "function main() { return 42 }")
    assert bad["error"]["code"] == "invalid_result"


def test_errors_name_the_line(client: TestClient, space: Space, rw) -> None:
    thrown = "function main(p) {\n  const x = 1;\n  throw new RangeError('too far ' + x);\n  return {};\n}\n"
    res = run(client, space, rw, thrown)
    assert res["error"]["code"] == "runtime_error"
    assert (
        res["error"]["details"]["type"] == "RangeError"
        and res["error"]["details"]["message"] == "too far 1"
    )
    assert res["error"]["details"]["line"] == 3 and res["error"]["details"]["column"] == 9
    syntax = client.post(
        "/v1/run-code", json={"language": "javascript", "code": "function main( {"}, headers=rw
    ).json()["data"]
    assert syntax["error"]["code"] == "runtime_error" and syntax["error"]["details"]["line"] == 1
    ok = client.post(
        "/v1/run-code",
        json={
            "language": "javascript",
            "code": "function main(p) { return {message: String(p.a)} }",
            "input": {"a": 5},
        },
        headers=rw,
    )
    assert ok.json()["data"]["message"] == "5"


def test_javascript_ctx_calls_builtins(client: TestClient, space: Space, rw) -> None:
    code = (
        "export async function handle(input, ctx) {\n"
        "  const r = await ctx.tools.calculate({ expression: '6*7' });\n"
        "  const bad = await ctx.tools['no_such_tool']({});\n"
        "  await ctx.audit('computed', { r });\n"
        "  return { message: String(r.result), rawData: { r, bad } };\n"
        "}\n"
    )
    tool = client.post(
        "/v1/custom-tools",
        json=seed_tool(space, name="js-ctx", language="javascript", code=code, parameters=None),
        headers=rw,
    ).json()["data"]
    res = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}}, headers=rw
    ).json()["data"]
    assert res["status"] == "ok" and res["message"] == "42", res
    assert res["raw_data"]["bad"]["error"] == "unknown_tool" and res["ctx_calls"] == 2
    stored = client.get(f"/v1/tool-calls/{res['tool_call_id']}", headers=rw).json()["data"]
    assert [a["event"] for a in stored["audit"]] == [
        "builtin.called",
        "custom.computed",
        "tool.invoked",
    ]


def test_runtimes_report_javascript(client: TestClient, rw) -> None:
    js = client.get("/v1/custom-tools/runtimes", headers=rw).json()["data"]["javascript"]
    assert js["available"] is True and js["isolation"]["seccomp"] == "allowlist"
    assert set(js["isolation"]["namespaces"]) == {"mount", "pid", "network", "ipc", "uts"}


def test_listed_packages_import_by_name_and_nothing_else(
    client: TestClient, space: Space, rw
) -> None:
    code = (
        "import _ from 'lodash';\n"
        "import dayjs from 'dayjs';\n"
        "import { z } from 'zod';\n"
        "const lodash = require('lodash');\n"
        "export function main(p) {\n"
        "  const ok = z.object({ n: z.number() }).safeParse({ n: 'x' }).success;\n"
        "  return { message: [_.chunk([1, 2, 3, 4], 2).length, dayjs('2026-01-31').add(1, 'month').format('YYYY-MM-DD'), ok, lodash === _].join(' ') };\n"
        "}\n"
    )
    assert run(client, space, rw, code, timeout_ms=20000)["message"] == "2 2026-02-28 false true"
    for bad in [
        "const fs = require('fs');\nfunction main() { return { message: 'x' } }",
        "import fs from 'node:fs';\nfunction main() { return { message: 'x' } }",
    ]:
        res = run(client, space, rw, bad)
        assert (
            res["error"]["code"] == "runtime_error"
            and "Tools can require: dayjs, lodash, zod" in res["error"]["message"]
        )
    deps = client.get("/v1/custom-tools/runtimes", headers=rw).json()["data"]["javascript"][
        "dependencies"
    ]
    assert deps == [
        {"name": "dayjs", "version": "1.11.13"},
        {"name": "lodash", "version": "4.17.21"},
        {"name": "zod", "version": "3.23.8"},
    ]


def test_ctx_can_be_printed_and_awaited_without_calling_tools(
    client: TestClient, space: Space, rw
) -> None:
    """JSON.stringify(ctx) and ``await ctx.tools`` are the language asking for toJSON and
    then: neither is a ctx call (which would count, or hang the await until the timeout)."""
    code = (
        "export async function handle(input, ctx) {\n"
        "  const text = JSON.stringify(ctx);\n"
        "  const tools = await ctx.tools;\n"
        "  return { message: typeof tools, rawData: JSON.parse(text) };\n"
        "}\n"
    )
    res = run(client, space, rw, code, timeout_ms=3000)
    assert res["status"] == "ok" and res["message"] == "object", res
    assert res["ctx_calls"] == 0, res
