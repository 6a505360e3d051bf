"""ctx from Python tool code: built-ins and custom tools through one path, limits, audit."""

from __future__ import annotations

from tests.builtins.conftest import Service, SmtpServer

SEED_000 = """
async def handle(input, ctx):
    recipient = input["email"]
    search = await ctx.tools.web_search({
        "query": f"{input['topic']} site:{input['domain']}",
        "count": 3,
    })
    ctx.audit("found_sources", {"count": len(search["results"])})
    result = await ctx.tools.send_email({
        "to": recipient,
        "subject": f"Re: {input['topic']}",
        "body_text": "Hi, here's what we found:\\n\\n" + "\\n".join(r["url"] for r in search["results"]),
    })
    if result.get("error"):
        return {"ok": False, "reason": result["error"], "details": result.get("details")}
    return {"ok": True, "message_id": result["message_id"]}
"""


def events(svc: Service, call_id: str) -> list[tuple[str, str, str | None]]:
    stored = svc.client.get(f"/v1/tool-calls/{call_id}", headers=svc.headers).json()["data"]
    return [(a["event"], a["source"], a["data"].get("name")) for a in stored["audit"]]


def test_seed_000_search_then_email_to_the_outbox(outbox_service: Service) -> None:
    svc = outbox_service
    svc.policy(email_allowlist=["example.org"])
    tool = svc.tool("search-and-email", SEED_000)
    res = svc.invoke(
        tool,
        {"email": "me@example.org", "topic": "kilns", "domain": "example.org"},
        agent_id="agent-9",
        conversation_id="conv-1",
    )
    assert res["status"] == "ok", res
    assert res["raw_data"]["ok"] is True and res["ctx_calls"] == 2
    mail = svc.client.get("/v1/outbox", headers=svc.headers).json()["data"][-1]
    assert mail["to"] == ["me@example.org"] and mail["subject"] == "Re: kilns"
    assert "https://example.org/0" in mail["body_text"] and mail["source"] == "code"
    assert events(svc, res["tool_call_id"]) == [
        ("builtin.called", "code", "web_search"),
        ("custom.found_sources", "code", None),
        ("builtin.called", "code", "send_email"),
        ("tool.invoked", "llm", None),
    ]


def test_seed_000_over_real_smtp(smtp_service: Service, smtp_server: SmtpServer) -> None:
    svc = smtp_service
    svc.policy(email_allowlist=["example.org"])
    tool = svc.tool("search-and-email", SEED_000)
    before = len(smtp_server.mailbox.messages)
    res = svc.invoke(tool, {"email": "me@example.org", "topic": "glaze", "domain": "example.org"})
    assert res["status"] == "ok" and res["raw_data"]["ok"] is True, res
    assert len(smtp_server.mailbox.messages) == before + 1
    assert smtp_server.mailbox.messages[-1]["Subject"] == "Re: glaze"


def test_failures_resolve_to_envelopes_and_never_throw(outbox_service: Service) -> None:
    svc = outbox_service
    svc.policy(email_allowlist=["example.org"])
    code = """
def handle(input, ctx):
    return {
        "recipient": ctx.tools.send_email({"to": "x@evil.test", "subject": "s", "body_text": "b"}),
        "unknown": ctx.tools["no_such_tool"]({}),
        "malformed": ctx.tools.calculate({"expr": "1+1"}),
        "bad_math": ctx.tools.calculate({"expression": "__import__('os')"}),
        "ok": ctx.tools.calculate({"expression": "6*7"}),
    }
"""
    res = svc.invoke(svc.tool("envelopes", code))
    assert res["status"] == "ok", res
    out = res["raw_data"]
    assert out["recipient"]["error"] == "recipient_not_allowed"
    assert out["unknown"]["error"] == "unknown_tool"
    assert out["malformed"]["error"] == "invalid_input"
    assert out["bad_math"]["error"] == "invalid_input"
    assert out["ok"] == {"result": 42}


def test_the_51st_call_is_refused(outbox_service: Service) -> None:
    code = """
def handle(input, ctx):
    results = [ctx.tools.calculate({"expression": f"{i}+1"}) for i in range(51)]
    return {"first": results[0], "fiftieth": results[49], "last": results[50]}
"""
    res = outbox_service.invoke(outbox_service.tool("greedy", code))
    assert res["raw_data"]["first"] == {"result": 1} and res["raw_data"]["fiftieth"] == {
        "result": 50
    }
    assert res["raw_data"]["last"]["error"] == "call_limit" and res["ctx_calls"] == 51


def test_custom_tools_compose_and_recursion_is_stopped(outbox_service: Service) -> None:
    svc = outbox_service
    double = svc.tool(
        "double", "def main(**p):\n    return {'message': str(p['n'] * 2), 'rawData': p['n'] * 2}"
    )
    caller = svc.tool(
        "quadruple",
        "def handle(input, ctx):\n    r = ctx.tools.double({'n': input['n']})\n    return ctx.tools['double']({'n': r['rawData']})",
    )
    res = svc.invoke(caller, {"n": 5})
    # The nested result has a string "message", so the caller's return is read as main's.
    assert res["status"] == "ok" and res["message"] == "20" and res["raw_data"] == 20, res
    by_id = svc.invoke(
        svc.tool(
            "by-id",
            f"def handle(i, ctx):\n    return ctx.tools['custom_{double['id']}']({{'n': 1}})",
        )
    )
    assert by_id["message"] == "2" and by_id["raw_data"] == 2
    me = svc.tool("selfish", "def handle(input, ctx):\n    return ctx.tools.selfish({})")
    res = svc.invoke(me)
    assert res["raw_data"]["error"] == "recursion"
    svc.tool("ping", "def handle(input, ctx):\n    return ctx.tools.pong({})")
    pong = svc.tool("pong", "def handle(input, ctx):\n    return ctx.tools.ping({})")
    res = svc.invoke(pong)
    # pong -> ping -> pong is refused at the second pong; ping hands the envelope back up.
    assert res["raw_data"]["error"] == "recursion"
    nested = svc.client.get(
        "/v1/audit", params={"tool_id": double["id"], "event": "tool.invoked"}, headers=svc.headers
    ).json()["data"]
    assert nested and all(r["source"] == "code" and r["data"]["parent_call_id"] for r in nested)


def test_a_broken_link_throws_and_late_calls_get_nothing(outbox_service: Service) -> None:
    svc = outbox_service
    broken = """
import os
def handle(input, ctx):
    for fd in range(3, 64):
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        ctx.tools.calculate({"expression": "1"})
    except ctx.LinkError as exc:
        raise RuntimeError("link broken as documented") from exc
    return "unreachable"
"""
    res = svc.invoke(svc.tool("broken-link", broken))
    # The report travels on the same channel, so the host sees the process end without one.
    assert res["error"]["code"] == "runtime_error"
    late = """
import time
def handle(input, ctx):
    time.sleep(2)
    return ctx.tools.calculate({"expression": "1"})
"""
    res = svc.invoke(svc.tool("late", late, timeout_ms=500))
    assert res["error"]["code"] == "timeout"
    calls = svc.client.get(
        "/v1/audit",
        params={"tool_call_id": res["tool_call_id"], "event": "builtin.called"},
        headers=svc.headers,
    ).json()["data"]
    assert calls == []


def test_ctx_carries_the_invocation(outbox_service: Service) -> None:
    code = """
def handle(input, ctx):
    return [ctx.agentId, ctx.agent_id, ctx.toolCallId, ctx.conversationId, ctx.powerUserId]
"""
    res = outbox_service.invoke(
        outbox_service.tool("who", code),
        agent_id="a1",
        conversation_id="c1",
        power_user_id="u1",
        tool_call_id="call-who-1",
    )
    assert res["raw_data"] == ["a1", "a1", "call-who-1", "c1", "u1"]


SEED_000_JS = """
export async function handle(input, ctx) {
  const recipient = input.email;
  const search = await ctx.tools.web_search({ query: `${input.topic} site:${input.domain}`, count: 3 });
  await ctx.audit('found_sources', { count: search.results.length });
  const result = await ctx.tools.send_email({
    to: recipient,
    subject: `Re: ${input.topic}`,
    body_text: `Hi, here's what we found:\\n\\n${search.results.map((r) => r.url).join('\\n')}`,
  });
  if (result.error) {
    return { ok: false, reason: result.error, details: result.details };
  }
  return { ok: true, message_id: result.message_id };
}
"""


def test_seed_000_in_javascript_to_outbox_and_smtp(
    outbox_service: Service, smtp_service: Service, smtp_server: SmtpServer
) -> None:
    payload = {"email": "me@example.org", "topic": "clay", "domain": "example.org"}
    for svc in (outbox_service, smtp_service):
        svc.policy(email_allowlist=["example.org"])
        tool = svc.tool("search-and-email-js", SEED_000_JS, language="javascript")
        res = svc.invoke(tool, payload)
        assert res["status"] == "ok" and res["raw_data"]["ok"] is True, res
        assert events(svc, res["tool_call_id"]) == [
            ("builtin.called", "code", "web_search"),
            ("custom.found_sources", "code", None),
            ("builtin.called", "code", "send_email"),
            ("tool.invoked", "api", None),
        ]
    mail = outbox_service.client.get("/v1/outbox", headers=outbox_service.headers).json()["data"][
        -1
    ]
    assert mail["subject"] == "Re: clay" and "https://example.org/0" in mail["body_text"]
    assert smtp_server.mailbox.messages[-1]["Subject"] == "Re: clay"
    refused = outbox_service.invoke(
        outbox_service.tool(
            "js-refused", SEED_000_JS.replace("search-and-email", "x"), language="javascript"
        ),
        {**payload, "email": "x@evil.test"},
    )
    assert refused["raw_data"] == {
        "ok": False,
        "reason": "recipient_not_allowed",
        "details": {"recipients": ["x@evil.test"]},
    }


def test_audit_rows_that_cannot_be_stored_are_dropped_with_a_note(outbox_service: Service) -> None:
    """An event too long, empty, not a string or holding NUL, or data holding NUL: the row
    is dropped like a row past a cap (the call goes on) and logs.stderr says why."""
    svc = outbox_service
    code = """
def handle(input, ctx):
    ctx.audit("e" * 200, {"a": 1})
    ctx.audit("", None)
    ctx.audit(None, None)
    ctx.audit("nul\\x00here", {"a": 1})
    ctx.audit("bad_data", {"text": "nul\\x00"})
    ctx.audit("kept", {"a": 1})
    return {"message": "done"}
"""
    res = svc.invoke(svc.tool("audit-unstorable", code))
    assert res["status"] == "ok" and res["message"] == "done", res
    stderr = res["logs"]["stderr"]
    assert "[ctx.audit: 3 rows dropped: the event must be a string of 1-64 characters]" in stderr
    assert "[ctx.audit: 1 row dropped: event must not contain NUL characters]" in stderr
    assert "[ctx.audit: 1 row dropped: data.text must not contain NUL characters]" in stderr
    custom = [e for e in events(svc, res["tool_call_id"]) if e[0].startswith("custom.")]
    assert custom == [("custom.kept", "code", None)]
