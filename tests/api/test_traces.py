"""Traces: every way a tool is called makes one trace, from the caller's ``traceparent``
(an HTTP header, MCP's ``_meta``) through the tool call, its runs on the runner and every
nested ``ctx`` call, with the GenAI attributes, and without the call's arguments or any
credential unless the setting asks for arguments.

The spans are collected with the SDK's in-memory exporter; the runner is served from this
process (``hosted``), so the runner's own spans are collected too.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import own_service, serving
from toolkiln import logs, telemetry
from toolkiln.app import Runtime
from toolkiln.services import tracing

TOKEN = "tk_traces_" + secrets.token_hex(16)
ARG = "arg-" + secrets.token_hex(8)  # a value given as an argument: never in a span
TRACE_ID = secrets.token_hex(16)
PARENT_ID = secrets.token_hex(8)
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
INNER = "def main(**p):\n    return {'message': 'inner ' + p['q']}\n"
OUTER = (
    "def handle(input, ctx):\n"
    "    got = ctx.tools['inner-tool']({'q': input['q']})\n"
    "    ctx.audit('checked', {'n': 1})\n"
    "    return {'message': got['message']}\n"
)
PROGRAM = (
    "def handle(input, ctx):\n"
    "    return {'message': ctx.tools['inner-tool']({'q': 'from a program'})['message']}\n"
)


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert telemetry.configure(processors=[SimpleSpanProcessor(exporter)]) is not None
    yield exporter
    telemetry.shutdown()


@pytest.fixture(scope="module")
def service(
    spans: InMemorySpanExporter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Runtime, TestClient]]:
    with own_service(tmp_path_factory.mktemp("traces"), TOKEN, hosted=True) as (rt, client, _):
        yield rt, client


@pytest.fixture(scope="module")
def shop(service: tuple[Runtime, TestClient]) -> dict[str, Any]:
    _, client = service
    ws = client.get("/v1/workspaces", headers=AUTH).json()["data"][0]["id"]
    q = {"q": {"type": "string", "required": True}}
    inner = _post(client, "/v1/custom-tools", _tool(ws, "inner-tool", INNER, q))
    outer = _post(client, "/v1/custom-tools", _tool(ws, "outer-tool", OUTER, q))
    agent = _post(client, "/v1/agents", {"workspace_id": ws, "name": "tracer"})
    for tool in (inner, outer):
        r = client.put(f"/v1/agents/{agent['id']}/custom-tools/{tool['id']}", headers=AUTH)
        assert r.status_code == 200, r.text
    return {"ws": ws, "inner": inner, "outer": outer, "agent": agent}


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _tool(ws: str, name: str, code: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "workspace_id": ws,
        "name": name,
        "language": "python",
        "code": code,
        "parameters": parameters,
    }


def _post(client: TestClient, path: str, body: Any, **headers: str) -> Any:
    r = client.post(path, json=body, headers={**AUTH, **headers})
    assert r.status_code in (200, 201), r.text
    return r.json()["data"]


def _trace(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    """The spans of the one trace the last call made (all of them must be of it)."""
    found = list(spans.get_finished_spans())
    assert found
    assert {s.context.trace_id for s in found} == {int(TRACE_ID, 16)}, [s.name for s in found]
    return found


def _named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def _parent(found: list[ReadableSpan], span: ReadableSpan) -> ReadableSpan | None:
    ids = {s.context.span_id: s for s in found}
    return ids.get(span.parent.span_id) if span.parent is not None else None


def _ancestors(found: list[ReadableSpan], span: ReadableSpan) -> list[str]:
    names = []
    at: ReadableSpan | None = span
    while at is not None and (at := _parent(found, at)) is not None:
        names.append(at.name)
    return names


def _nothing_given_or_secret(found: list[ReadableSpan]) -> None:
    for span in found:
        text = json.dumps(dict(span.attributes or {}), default=str) + span.name
        assert ARG not in text, span.name
        assert TOKEN not in text, span.name
        assert "gen_ai.tool.call.arguments" not in (span.attributes or {})


def test_a_rest_invoke_is_one_trace_under_the_callers_traceparent(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    result = _post(
        client,
        f"/v1/custom-tools/{shop['outer']['id']}/invoke",
        {"input": {"q": ARG}, "conversation_id": "conv-1"},
        traceparent=TRACEPARENT,
    )
    assert result["status"] == "ok", result
    found = _trace(spans)
    http = _named(found, "POST /v1/custom-tools/{tool_id}/invoke")
    assert len(http) == 1 and http[0].parent.span_id == int(PARENT_ID, 16)
    assert http[0].attributes["http.response.status_code"] == 200
    outer = _named(found, "execute_tool outer-tool")[0]
    a = outer.attributes
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert a["gen_ai.tool.name"] == "outer-tool"
    assert a["gen_ai.tool.call.id"] == result["tool_call_id"]
    assert a["toolkiln.workspace.id"] == shop["ws"]
    assert a["toolkiln.tool.id"] == shop["outer"]["id"]
    assert a["toolkiln.tool.version"] == 1
    assert a["toolkiln.outcome"] == "ok"
    assert a["toolkiln.counted"] is True
    assert a["session.id"] == "conv-1"
    assert "error.type" not in a
    assert _parent(found, outer) is http[0]
    # The nested call: ctx.tools under the runner's span of the outer run, the inner tool
    # under it with its own run on the runner, and the audit row.
    inner = _named(found, "execute_tool inner-tool")[0]
    assert inner.attributes["toolkiln.source"] == "code"
    assert _ancestors(found, inner)[:4] == ["ctx.tools", "runner.serve", "runner.run", "run python"]
    assert "execute_tool outer-tool" in _ancestors(found, inner)
    assert _parent(found, _named(found, "ctx.audit")[0]).name == "runner.run"
    runs = _named(found, "run python")
    assert len(runs) == 2 and all(r.attributes["toolkiln.run.outcome"] == "return" for r in runs)
    assert len(_named(found, "runner.wait")) == 2
    assert len(_named(found, "sandbox.wait")) == 2
    _nothing_given_or_secret(found)


def test_an_error_is_on_the_span_as_its_code(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    result = _post(
        client,
        f"/v1/custom-tools/{shop['inner']['id']}/invoke",
        {"input": {"q": 7}},
        traceparent=TRACEPARENT,
    )
    assert result["error"]["code"] == "invalid_input"
    span = _named(_trace(spans), "execute_tool inner-tool")[0]
    assert span.attributes["error.type"] == "invalid_input"
    assert span.attributes["toolkiln.counted"] is False
    assert span.status.status_code.name == "ERROR"


def test_an_agents_tool_call_is_one_trace(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    body = {"name": "outer-tool", "arguments": {"q": ARG}, "conversation_id": "conv-2"}
    result = _post(
        client, f"/v1/agents/{shop['agent']['id']}/tool-calls", body, traceparent=TRACEPARENT
    )
    assert result["status"] == "ok", result
    found = _trace(spans)
    outer = _named(found, "execute_tool outer-tool")[0]
    assert outer.attributes["toolkiln.source"] == "llm"
    assert outer.attributes["gen_ai.agent.id"] == shop["agent"]["id"]
    assert outer.attributes["session.id"] == "conv-2"
    assert _parent(found, outer).name == "POST /v1/agents/{agent_id}/tool-calls"
    assert _named(found, "execute_tool inner-tool")
    _nothing_given_or_secret(found)


def test_a_code_mode_program_and_its_ctx_calls_are_one_trace(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    body = {"name": "run_program", "arguments": {"language": "python", "code": PROGRAM}}
    result = _post(
        client, f"/v1/agents/{shop['agent']['id']}/tool-calls", body, traceparent=TRACEPARENT
    )
    assert result["status"] == "ok", result
    found = _trace(spans)
    program = _named(found, "execute_tool run_program")[0]
    inner = _named(found, "execute_tool inner-tool")[0]
    assert "execute_tool run_program" in _ancestors(found, inner)
    assert program.attributes["toolkiln.outcome"] == "ok"
    assert all(PROGRAM not in json.dumps(dict(s.attributes or {})) for s in found)


def test_a_test_run_is_one_trace(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    draft = {
        **_tool(shop["ws"], "draft-tool", OUTER, {"q": {"type": "string"}}),
        "input": {"q": ARG},
    }
    result = _post(client, "/v1/custom-tools/test", draft, traceparent=TRACEPARENT)
    assert result["status"] == "ok", result
    found = _trace(spans)
    run = _named(found, "execute_tool draft-tool")[0]
    assert run.attributes["toolkiln.test_run"] is True
    assert run.attributes["toolkiln.counted"] is False
    inner = _named(found, "execute_tool inner-tool")[0]
    assert inner.attributes["toolkiln.counted"] is False  # nothing under a test run counts
    _nothing_given_or_secret(found)


def test_mcp_takes_the_traceparent_in_meta(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    rt, _ = service
    spans.clear()
    # Another trace id on the HTTP request: the message's _meta is the caller's context.
    other = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"

    async def call(base: str) -> Any:
        headers = {**AUTH, "traceparent": other}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{base}/mcp/agents/{shop['agent']['id']}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    spans.clear()
                    return await session.call_tool(
                        "outer-tool", {"q": ARG}, meta={"traceparent": TRACEPARENT}
                    )

    with serving(rt) as base:
        result = anyio.run(call, base)
    assert not result.is_error, result
    found = [s for s in spans.get_finished_spans() if s.context.trace_id == int(TRACE_ID, 16)]
    message = _named(found, "tools/call outer-tool")[0]
    assert message.parent.span_id == int(PARENT_ID, 16)
    assert message.attributes["mcp.method.name"] == "tools/call"
    assert message.attributes["mcp.session.id"]
    outer = _named(found, "execute_tool outer-tool")[0]
    assert _parent(found, outer) is message
    assert "execute_tool outer-tool" in _ancestors(
        found, _named(found, "execute_tool inner-tool")[0]
    )
    _nothing_given_or_secret(list(spans.get_finished_spans()))


async def _every_message(session: ClientSession) -> list[str]:
    """Each kind of MCP message, under the current span (the SDK's client puts it in each
    request's ``_meta``): the names the server's spans should have, in order."""
    await session.initialize()  # initialize, then notifications/initialized
    await session.send_ping()
    await session.list_tools()
    assert not (await session.call_tool("outer-tool", {"q": ARG})).is_error
    assert (await session.call_tool("inner-tool", {"q": 7})).is_error  # answered as failed
    with pytest.raises(MCPError) as unserved:
        await session.list_resources()  # no resources here: not served
    assert unserved.value.error.code == METHOD_NOT_FOUND
    return [
        "initialize",
        "notifications/initialized",
        "ping",
        "tools/list",
        "tools/call outer-tool",
        "tools/call inner-tool",
        "resources/list",
    ]


def _check_messages(
    found: list[dict[str, Any]], names: list[str], trace_id: int, parent_id: int, transport: str
) -> None:
    """One span per message, in order, each a SERVER span named and attributed as the MCP
    conventions say, every request's under the client's span."""
    messages = [s for s in found if "mcp.method.name" in s["attributes"]]
    assert [s["name"] for s in messages] == names
    for span in messages:
        a = span["attributes"]
        assert span["kind"] == "SERVER"
        assert a["mcp.method.name"] == span["name"].split(" ")[0]
        assert a["network.transport"] == transport
        assert a["mcp.protocol.version"]
        if span["name"].startswith("notifications/"):
            assert "jsonrpc.request.id" not in a
            continue
        assert a["jsonrpc.request.id"]
        assert (span["trace_id"], span["parent_id"]) == (trace_id, parent_id), span["name"]
    by_name = {s["name"]: s["attributes"] for s in messages}
    assert by_name["tools/call outer-tool"]["gen_ai.tool.name"] == "outer-tool"
    assert "error.type" not in by_name["tools/call outer-tool"]
    assert by_name["tools/call inner-tool"]["error.type"] == "tool_error"
    assert by_name["resources/list"]["error.type"] == str(METHOD_NOT_FOUND)
    assert by_name["resources/list"]["rpc.response.status_code"] == str(METHOD_NOT_FOUND)
    assert "error.type" not in by_name["ping"] and "error.type" not in by_name["initialize"]


def _plain(span: ReadableSpan) -> dict[str, Any]:
    """A span as the console exporter writes it, the few fields the checks read."""
    return {
        "name": span.name,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "trace_id": span.context.trace_id,
        "parent_id": span.parent.span_id if span.parent is not None else None,
    }


def test_every_mcp_message_over_http_is_one_span(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    rt, _ = service

    async def talk(base: str) -> tuple[list[str], int, int]:
        async with httpx2.AsyncClient(headers=AUTH, timeout=30) as http:
            url = f"{base}/mcp/agents/{shop['agent']['id']}?names=name"  # as they are called
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    with tracing.span("the agent's turn") as turn:
                        names = await _every_message(session)
                    ids = turn.get_span_context()
                    return names, ids.trace_id, ids.span_id

    spans.clear()
    with serving(rt) as base:
        names, trace_id, parent_id = anyio.run(talk, base)
    found = [_plain(s) for s in spans.get_finished_spans()]
    _check_messages(found, names, trace_id, parent_id, "tcp")
    calls = [s for s in found if s["name"].startswith("tools/call")]
    assert all(s["attributes"]["mcp.session.id"] for s in calls)
    assert all(s["attributes"]["network.protocol.name"] == "http" for s in calls)
    _nothing_given_or_secret(list(spans.get_finished_spans()))


def _console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the console exporter wrote among a process's standard error."""
    decoder = json.JSONDecoder()
    found = []
    at = text.find('{\n    "name"')
    while at >= 0:
        span, end = decoder.raw_decode(text, at)
        context = span["context"]
        found.append(
            {
                "name": span["name"],
                "kind": span["kind"].removeprefix("SpanKind."),
                "attributes": span["attributes"],
                "trace_id": int(context["trace_id"], 16),
                "parent_id": int(span["parent_id"], 16) if span["parent_id"] else None,
            }
        )
        at = text.find('{\n    "name"', end)
    return found


def test_every_mcp_message_over_stdio_is_one_span(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], tmp_path: Path
) -> None:
    """``toolkiln mcp`` with traces on (the console exporter, on standard error)."""
    rt, _ = service
    env = {
        "TOOLKILN_DATA_DIR": str(rt.settings.data_dir),
        "PATH": os.environ.get("PATH", ""),
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # written as they end, not only at the exit
    }
    exe = str(Path(sys.executable).parent / "toolkiln")
    params = StdioServerParameters(
        command=exe, args=["mcp", "--agent", shop["agent"]["id"], "--names", "name"], env=env
    )
    err = tmp_path / "stderr"

    async def talk() -> tuple[list[str], int, int]:
        with err.open("w") as sink:
            async with stdio_client(params, errlog=sink) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    with tracing.span("the agent's turn") as turn:
                        names = await _every_message(session)
                    ids = turn.get_span_context()
                    return names, ids.trace_id, ids.span_id

    names, trace_id, parent_id = anyio.run(talk)
    found = _console_spans(err.read_text())
    _check_messages(found, names, trace_id, parent_id, "pipe")
    outer = next(s for s in found if s["name"] == "execute_tool outer-tool")
    assert outer["trace_id"] == trace_id
    assert all("mcp.session.id" not in s["attributes"] for s in found)
    text = json.dumps(found)
    assert ARG not in text and TOKEN not in text


def test_a_save_and_a_validation_have_their_code_check_span(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    """Each text sent to a runner's code checkers is a ``code_check`` span under the request
    that sent it, naming the language and what the check came to, never the code."""
    _, client = service
    marker = "code-" + secrets.token_hex(8)  # in each text: never in a span
    broken = f"def main(**p):\n    return {{'message': '{marker}'\n"
    draft = _tool(shop["ws"], "checked-tool", broken, {})
    spans.clear()
    r = client.post(
        "/v1/custom-tools/validate", json=draft, headers={**AUTH, "traceparent": TRACEPARENT}
    )
    assert r.status_code == 422, r.text
    found = _trace(spans)
    check = _named(found, "code_check")
    assert len(check) == 1 and _parent(found, check[0]).name == "POST /v1/custom-tools/validate"
    a = check[0].attributes
    assert check[0].kind.name == "CLIENT"
    assert a["toolkiln.code.language"] == "python"
    assert a["toolkiln.workspace.id"] == shop["ws"]
    assert a["toolkiln.code_check.outcome"] == "problems"
    assert a["toolkiln.code_check.problems"] >= 1
    assert "error.type" not in a
    spans.clear()
    fine = f"def main(**p):\n    return {{'message': '{marker}'}}\n"
    _post(client, "/v1/custom-tools", {**draft, "code": fine}, traceparent=TRACEPARENT)
    found = _trace(spans)
    check = _named(found, "code_check")
    assert len(check) == 1 and _parent(found, check[0]).name == "POST /v1/custom-tools"
    assert check[0].attributes["toolkiln.code_check.outcome"] == "ok"
    assert check[0].attributes["toolkiln.code_check.problems"] == 0
    for span in found:
        assert marker not in json.dumps(dict(span.attributes or {}), default=str) + span.name


def test_arguments_and_results_only_when_the_setting_says_so(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    tracer = tracing._state.tracer
    tracing.use(tracer, record_io=True, redact=logs.redact)
    try:
        spans.clear()
        given = {"q": f"{ARG} Bearer {TOKEN}"}
        _post(
            client,
            f"/v1/custom-tools/{shop['inner']['id']}/invoke",
            {"input": given},
            traceparent=TRACEPARENT,
        )
    finally:
        tracing.use(tracer, record_io=False, redact=logs.redact)
    span = _named(_trace(spans), "execute_tool inner-tool")[0]
    assert ARG in span.attributes["gen_ai.tool.call.arguments"]
    assert ARG in span.attributes["gen_ai.tool.call.result"]
    assert TOKEN not in span.attributes["gen_ai.tool.call.arguments"]  # redacted as in logs


def test_a_request_without_traceparent_starts_a_trace_of_its_own(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    _post(client, f"/v1/custom-tools/{shop['inner']['id']}/invoke", {"input": {"q": "x"}})
    found = list(spans.get_finished_spans())
    assert len({s.context.trace_id for s in found}) == 1
    root = [s for s in found if s.parent is None]
    assert [s.name for s in root] == ["POST /v1/custom-tools/{tool_id}/invoke"]


def test_no_span_is_made_when_traces_are_off(
    service: tuple[Runtime, TestClient], shop: dict[str, Any], spans: InMemorySpanExporter
) -> None:
    _, client = service
    tracer = tracing._state.tracer
    tracing.use(None)
    try:
        spans.clear()
        _post(
            client,
            f"/v1/custom-tools/{shop['outer']['id']}/invoke",
            {"input": {"q": "x"}},
            traceparent=TRACEPARENT,
        )
    finally:
        tracing.use(tracer, redact=logs.redact)
    assert list(spans.get_finished_spans()) == []


def test_the_otel_variables_turn_traces_on() -> None:
    assert telemetry.wanted({}) == []
    assert telemetry.wanted({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert (
        telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
        == []
    )
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) == ["otlp"]
    with pytest.raises(telemetry.TelemetryError):
        telemetry.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_a_runner_cannot_move_a_span_into_another_trace(spans: InMemorySpanExporter) -> None:
    """A ctx call's traceparent, sent back by a runner, is taken only within its run's trace."""
    spans.clear()
    foreign = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    with tracing.span("run") as run:
        same = f"00-{run.get_span_context().trace_id:032x}-{PARENT_ID}-01"
        with tracing.under(foreign), tracing.span("from a foreign parent"):
            pass
        with tracing.under(same), tracing.span("from its own trace"):
            pass
    found = {s.name: s for s in spans.get_finished_spans()}
    assert found["from a foreign parent"].parent.span_id == run.get_span_context().span_id
    assert found["from its own trace"].parent.span_id == int(PARENT_ID, 16)


def test_http_request_has_a_client_span_naming_the_host_only(
    service: tuple[Runtime, TestClient], spans: InMemorySpanExporter
) -> None:
    _, client = service
    spans.clear()
    refused = {"method": "GET", "url": f"http://not-listed.invalid/{ARG}?key={ARG}"}
    r = client.post(
        "/v1/builtin-tools/http_request/call",
        json={"input": refused},
        headers={**AUTH, "traceparent": TRACEPARENT},
    )
    assert r.status_code == 200 and r.json()["data"]["error"], r.text
    found = _trace(spans)
    span = _named(found, "http_request")[0]
    assert _parent(found, span).name == "execute_tool http_request"
    assert span.kind.name == "CLIENT"
    assert span.attributes["server.address"] == "not-listed.invalid"
    assert span.attributes["error.type"] == r.json()["data"]["error"]
    _nothing_given_or_secret(found)  # neither the URL's path nor its query
