"""send_email, web_search and surface_file through the one dispatch path, as a model calls them."""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.builtins.conftest import SMTP_USER, Service, SmtpServer, make_service


def test_builtins_are_listed_with_schemas(outbox_service: Service) -> None:
    r = outbox_service.client.get("/v1/builtin-tools", headers=outbox_service.headers)
    names = [t["name"] for t in r.json()["data"]]
    assert names == [
        "calculate",
        "http_request",
        "run_code",
        "send_email",
        "surface_file",
        "web_search",
    ]
    assert all(t["input_schema"]["type"] == "object" for t in r.json()["data"])


def test_email_goes_to_the_outbox_and_respects_the_allowlist(outbox_service: Service) -> None:
    svc = outbox_service
    svc.policy(email_allowlist=["boss@corp.test", "example.org"])
    sent = svc.builtin(
        "send_email",
        {"to": ["boss@corp.test", "a@sales.example.org"], "subject": "Hi", "body_text": "x"},
        agent_id="agent-1",
    )
    assert sent["message_id"].startswith("<")
    refused = svc.builtin(
        "send_email", {"to": "mallory@evil.test", "subject": "s", "body_text": "b"}
    )
    assert refused == {
        "error": "recipient_not_allowed",
        "details": {"recipients": ["mallory@evil.test"]},
    }
    for bad in [
        {"to": "boss@corp.test", "subject": "x\r\nBcc: mallory@evil.test", "body_text": "b"},
        {"to": "boss@corp.test\nBcc: mallory@evil.test", "subject": "x", "body_text": "b"},
        {"to": "boss@corp.test", "body_text": "no subject"},
    ]:
        assert svc.builtin("send_email", bad)["error"] == "invalid_input"
    box = svc.client.get("/v1/outbox", headers=svc.headers).json()["data"]
    assert len(box) == 1
    assert box[0]["to"] == ["boss@corp.test", "a@sales.example.org"] and box[0]["source"] == "llm"
    rows = svc.client.get(
        "/v1/audit", params={"event": "builtin.called"}, headers=svc.headers
    ).json()["data"]
    emails = [r for r in rows if r["data"]["name"] == "send_email"]
    assert [r["data"]["status"] for r in emails] == ["ok", "error", "error", "error", "error"]
    assert emails[0]["source"] == "llm" and emails[0]["agent_id"] == "agent-1"
    assert emails[0]["data"]["cost"] == {"calls": 1, "recipients": 2}


def test_email_over_smtp_with_starttls_and_auth(
    smtp_service: Service, smtp_server: SmtpServer
) -> None:
    svc = smtp_service
    svc.policy(email_allowlist=["team.test"])
    sent = svc.builtin(
        "send_email",
        {
            "to": "ops@team.test",
            "cc": ["cc@team.test"],
            "subject": "Report",
            "body_text": "plain",
            "body_html": "<p>html</p>",
        },
    )
    assert "error" not in sent, sent
    assert smtp_server.mailbox.got.wait(10)
    msg = smtp_server.mailbox.messages[-1]
    assert (
        msg["Subject"] == "Report" and msg["To"] == "ops@team.test" and msg["Cc"] == "cc@team.test"
    )
    assert msg["Message-ID"] == sent["message_id"] and msg.is_multipart()
    assert smtp_server.mailbox.envelopes[-1] == (
        "bot@toolkiln.test",
        ["ops@team.test", "cc@team.test"],
    )
    assert SMTP_USER in smtp_server.mailbox.logins
    assert svc.client.get("/v1/outbox", headers=svc.headers).json()["data"] == []


def test_search_providers(outbox_service: Service, smtp_service: Service) -> None:
    searx = outbox_service.builtin("web_search", {"query": "kilns", "count": 3})
    assert [r["title"] for r in searx["results"]] == ["kilns 0", "kilns 1", "kilns 2"]
    assert searx["results"][0] == {
        "title": "kilns 0",
        "url": "https://example.org/0",
        "snippet": "about kilns",
    }
    brave = smtp_service.builtin("web_search", {"query": "kilns", "count": 2})
    assert [r["url"] for r in brave["results"]] == ["https://brave.test/0", "https://brave.test/1"]
    assert outbox_service.builtin("web_search", {"query": "explode"})["error"] == "provider_failed"
    assert outbox_service.builtin("web_search", {"count": 2})["error"] == "invalid_input"


def test_search_without_a_provider_is_not_configured() -> None:
    from toolkiln.builtins.search import WebSearch
    from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure
    from toolkiln.domain.records import Policy

    with pytest.raises(BuiltinFailure) as caught:
        WebSearch(None).call({"query": "x"}, BuiltinCall("w", Policy(), "api"))
    assert caught.value.code == "not_configured"


def test_surface_file_signed_links(outbox_service: Service) -> None:
    svc = outbox_service
    made = svc.builtin(
        "surface_file", {"filename": '../../etc/re"port\r\n.csv', "content": "a,b\n1,2\n"}
    )
    path = urlsplit(made["url"])
    url = f"{path.path}?{path.query}"
    got = svc.client.get(url)
    assert got.status_code == 200 and got.content == b"a,b\n1,2\n"
    assert got.headers["content-type"].startswith("text/csv")
    disposition = got.headers["content-disposition"]
    assert (
        disposition.startswith("attachment;") and "\r" not in disposition and "/" not in disposition
    )
    assert got.headers["x-content-type-options"] == "nosniff"
    q = parse_qs(path.query)
    tampered = f"{path.path}?expires={q['expires'][0]}&sig={'0' * 64}"
    assert svc.client.get(tampered).status_code == 403
    later = f"{path.path}?expires={int(q['expires'][0]) + 10}&sig={q['sig'][0]}"
    assert svc.client.get(later).status_code == 403
    assert svc.client.get(f"{path.path}").status_code == 403
    binary = svc.builtin("surface_file", {"filename": "x.bin", "content_base64": "AAEC"})
    assert "error" not in binary
    assert (
        svc.builtin("surface_file", {"filename": "x", "content_base64": "!!"})["error"]
        == "invalid_input"
    )
    assert svc.builtin("surface_file", {"filename": "x"})["error"] == "invalid_input"


@pytest.mark.parametrize(
    "mime", ["text/plain\n", "text/文字", "text/plain; charset=x", "a/b\r\nX: y"]
)
def test_surface_file_refuses_a_type_no_header_can_carry(
    outbox_service: Service, mime: str
) -> None:
    made = outbox_service.builtin(
        "surface_file", {"filename": "a.txt", "content": "hi", "mime_type": mime}
    )
    assert made["error"] == "invalid_input", made


def test_a_stored_type_no_header_can_carry_is_served_as_octet_stream(
    outbox_service: Service,
) -> None:
    """A file stored before the type's pattern was narrowed: its link still works."""
    files = outbox_service.runtime.services.files
    stored = files.store(outbox_service.workspace_id, "a.txt", b"hi", "text/plain\n")
    path = urlsplit(stored["url"])
    got = outbox_service.client.get(f"{path.path}?{path.query}")
    assert got.status_code == 200 and got.content == b"hi"
    assert got.headers["content-type"] == "application/octet-stream"
    ok = files.store(outbox_service.workspace_id, "b.txt", b"hi", "text/plain")
    good = urlsplit(ok["url"])
    typed = outbox_service.client.get(f"{good.path}?{good.query}").headers["content-type"]
    assert typed.startswith("text/plain")


def test_expired_links_are_refused(outbox_service: Service) -> None:
    files = outbox_service.runtime.services.files
    stored = files.store(outbox_service.workspace_id, "old.txt", b"x", "text/plain", ttl_s=-1)
    path = urlsplit(stored["url"])
    assert outbox_service.client.get(f"{path.path}?{path.query}").status_code == 403
    assert stored["expires_at"].timestamp() < time.time()


def test_policy_can_withhold_a_builtin(outbox_service: Service) -> None:
    svc = outbox_service
    svc.policy(builtins=["send_email", "web_search", "surface_file", "run_code"])
    try:
        assert svc.builtin("calculate", {"expression": "1+1"})["error"] == "not_allowed"
        assert svc.builtin("no_such_tool", {})["error"] == "unknown_tool"
    finally:
        svc.policy(builtins=["calculate", "send_email", "web_search", "surface_file", "run_code"])
    assert svc.builtin("calculate", {"expression": "1+1"}) == {"result": 2}


def test_a_failing_search_provider_is_reported_without_its_address(
    tmp_path_factory: pytest.TempPathFactory, search_url: str
) -> None:
    """The provider's URL may carry a password (SearXNG behind basic auth): the failure's
    text named the whole URL to any workspace's caller (until 2026-12-06)."""
    secret = "S3cretPW-" + str(time.time_ns())
    with_password = search_url.replace("http://", f"http://searx:{secret}@")
    for svc in make_service(
        tmp_path_factory.mktemp("searx-auth"), search_provider="searxng", search_url=with_password
    ):
        ok = svc.builtin("web_search", {"query": "kilns", "count": 1})
        assert ok["results"][0]["title"] == "kilns 0"
        failed = svc.builtin("web_search", {"query": "explode"})
        assert failed["error"] == "provider_failed", failed
        said = json.dumps(failed)
        host = urlsplit(search_url).netloc
        assert secret not in said and host not in said, said
        assert "HTTP 5" in failed["details"]["reason"], failed
