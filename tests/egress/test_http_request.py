"""http_request from tool code, both languages and both databases, against real HTTP and
HTTPS servers on loopback (the workspace allows private addresses: they are loopback)."""

from __future__ import annotations

import ssl

import trustme

from tests.egress.kit import Kit
from tests.egress.servers import Running, server


def test_https_with_a_secret_toward_its_host(kit: Kit, https: Running, language: str) -> None:
    kit.policy(egress_private=True)
    value = "sk-live-" + "a1b2c3d4e5f6"
    kit.secret("API_KEY", value, [f"localhost:{https.port}"])
    tool = kit.tool(language, [f"localhost:{https.port}"])
    got = kit.answer(
        tool,
        {
            "method": "POST",
            "url": https.url("/echo?q=1", "localhost"),
            "headers": {"Authorization": "Bearer {{secrets.API_KEY}}"},
            "json": {"hello": "world"},
        },
    )
    sent = https.seen.requests[-1]
    assert sent["headers"]["authorization"] == f"Bearer {value}"
    assert sent["headers"]["host"] == f"localhost:{https.port}"
    assert sent["body"] == '{"hello": "world"}'
    assert sent["headers"]["content-type"] == "application/json"
    assert got["status"] == 200 and got["truncated"] is False
    # the echo carries the value back: the answer shows the placeholder instead
    assert got["json"]["headers"]["authorization"] == "Bearer {{secrets.API_KEY}}"
    rows = kit.audit("http.requested")
    assert rows[-1]["tool_id"] == tool
    data = rows[-1]["data"]
    assert (data["method"], data["host"], data["path"], data["status"]) == (
        "POST",
        "localhost",
        "/echo",
        200,
    )
    assert data["bytes"] > 0 and data["duration_ms"] >= 0


def test_plain_http_and_a_text_answer(kit: Kit, http: Running, language: str) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool(language, [f"127.0.0.1:{http.port}"])
    got = kit.answer(tool, {"method": "GET", "url": http.url("/big?n=10")})
    assert got == {
        "status": 200,
        "headers": got["headers"],
        "body": "x" * 10,
        "truncated": False,
    }
    assert got["headers"]["content-type"] == "text/plain"


def test_the_placeholder_toward_another_host_sends_nothing(
    kit: Kit, https: Running, other: Running, language: str
) -> None:
    kit.policy(egress_private=True)
    kit.secret("API_KEY", "sk-other-0123456789", [f"localhost:{https.port}"])
    tool = kit.tool(language, [f"localhost:{https.port}", f"127.0.0.1:{other.port}"])
    for request in (
        {"headers": {"Authorization": "Bearer {{secrets.API_KEY}}"}},
        {"url": other.url("/echo?key={{secrets.API_KEY}}")},
        {"headers": {"X-Key": "{{ secrets.NO_SUCH }}"}},
    ):
        got = kit.answer(tool, {"method": "GET", "url": other.url("/echo"), **request})
        assert got["error"] == "secret_not_allowed", got
    assert other.seen.connections == 0


def test_egress_is_what_the_version_lists(kit: Kit, http: Running, other: Running) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool("python", [f"127.0.0.1:{http.port}"])
    got = kit.answer(tool, {"method": "GET", "url": other.url("/json")})
    assert got["error"] == "egress_denied" and got["details"]["host"] == "127.0.0.1"
    none = kit.tool("python", [])
    got = kit.answer(none, {"method": "GET", "url": http.url("/json")})
    assert got["error"] == "egress_denied"
    assert other.seen.connections == 0 and http.seen.connections == 0


def test_a_redirect_off_the_list_is_refused(
    kit: Kit, https: Running, other: Running, language: str
) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool(language, [f"localhost:{https.port}"])
    away = https.url(f"/redirect?to={other.url('/json')}", "localhost")
    got = kit.answer(tool, {"method": "GET", "url": away})
    assert got["error"] == "egress_denied" and got["details"]["host"] == "127.0.0.1"
    assert other.seen.connections == 0
    home = https.url("/redirect?to=/json&code=307", "localhost")
    assert kit.answer(tool, {"method": "GET", "url": home})["json"] == {"ok": True}


def test_a_secret_header_does_not_follow_a_redirect_to_another_host(
    kit: Kit, https: Running, http: Running
) -> None:
    kit.policy(egress_private=True)
    kit.secret("API_KEY", "sk-redirect-9876543210", [f"localhost:{https.port}"])
    tool = kit.tool("python", [f"localhost:{https.port}", f"127.0.0.1:{http.port}"])
    away = https.url(f"/redirect?to={http.url('/echo')}", "localhost")
    got = kit.answer(
        tool,
        {"method": "GET", "url": away, "headers": {"X-Key": "{{secrets.API_KEY}}", "X-A": "1"}},
    )
    assert got["status"] == 200
    seen = http.seen.requests[-1]["headers"]
    assert "x-key" not in seen and seen["x-a"] == "1"


def test_a_private_address_is_refused_unless_the_policy_allows_it(kit: Kit, https: Running) -> None:
    tool = kit.tool("python", [f"localhost:{https.port}"])
    got = kit.answer(tool, {"method": "GET", "url": https.url("/json", "localhost")})
    assert got["error"] == "egress_denied" and got["details"]["host"] == "localhost"
    assert "127.0.0.1" in got["details"]["reason"] or "::1" in got["details"]["reason"]
    assert https.seen.connections == 0
    kit.policy(egress_private=True)
    got = kit.answer(tool, {"method": "GET", "url": https.url("/json", "localhost")})
    assert got["json"] == {"ok": True}


def test_answers_are_capped(kit: Kit, http: Running) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool("python", [f"127.0.0.1:{http.port}"])
    got = kit.answer(tool, {"method": "GET", "url": http.url("/big?n=600000")})
    assert got["truncated"] is True and len(got["body"]) == 524_288
    rows = kit.audit("http.requested")
    assert rows[-1]["data"]["bytes"] == 524_288
    # A compressed answer (the service asks for identity) could grow past the cap once
    # decoded: it is refused, whatever its size on the wire.
    packed = kit.answer(tool, {"method": "GET", "url": http.url("/gzip?n=50000000")})
    assert packed["error"] == "request_failed" and packed["details"]["reason"] == "compressed"
    assert http.seen.requests[-1]["headers"]["accept-encoding"] == "identity"


def test_a_slow_answer_ends_at_the_request_timeout(kit: Kit, http: Running) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool("python", [f"127.0.0.1:{http.port}"])
    got = kit.answer(tool, {"method": "GET", "url": http.url("/slow"), "timeout_ms": 300})
    assert got["error"] == "timeout"


def test_tls_is_verified(kit: Kit) -> None:
    """A certificate from a CA the service does not trust is refused before anything is sent."""
    stranger = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    stranger.issue_cert("localhost").configure_cert(context)
    kit.policy(egress_private=True)
    with server(context) as untrusted:
        tool = kit.tool("python", [f"localhost:{untrusted.port}"])
        got = kit.answer(tool, {"method": "GET", "url": untrusted.url("/json", "localhost")})
        assert untrusted.seen.requests == []
    assert got["error"] == "request_failed" and got["details"]["reason"] == "tls", got


def test_each_request_counts_in_the_call_budget(kit: Kit, http: Running) -> None:
    kit.policy(egress_private=True)
    code = (
        "def main(*, ctx, **params):\n"
        "    out = [ctx.tools.http_request({'method': 'GET', 'url': params['url']})\n"
        "           for _ in range(51)]\n"
        "    return {'message': 'done', 'rawData': [o.get('error') for o in out]}\n"
    )
    body = {
        "workspace_id": kit.space.id,
        "name": "many",
        "language": "python",
        "code": code,
        "input_schema": {"type": "object"},
        "egress": [f"127.0.0.1:{http.port}"],
        "timeout_ms": 20000,
    }
    tool = kit.client.post("/v1/custom-tools", json=body, headers=kit.rw).json()["data"]["id"]
    url = f"/v1/custom-tools/{tool}/invoke"
    r = kit.client.post(url, json={"input": {"url": http.url("/json")}}, headers=kit.rw)
    errors = r.json()["data"]["raw_data"]
    assert errors[:50] == [None] * 50 and errors[50] == "call_limit"
    assert len(http.seen.requests) == 50
