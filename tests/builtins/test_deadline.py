"""A built-in called from tool code runs within the calling call's time: peers that accept a
connection and then say nothing, or trickle a byte now and then, cannot hold a call past
its ``timeout_ms``. The built-in answers its own ``timeout`` envelope while the tool still
has time to read it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.builtins.conftest import Service, make_service

TIMEOUT_MS = 2000
BOUND_MS = TIMEOUT_MS + 3000  # a behavioural bound, not a benchmark


class Peer:
    """A TCP listener on loopback whose every connection gets ``behave(conn)`` in a thread."""

    def __init__(self, behave: str) -> None:
        self.behave = behave
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if self.behave == "silent":  # accepts, never writes, never closes
                self.stop.wait(60)
                return
            # Trickle: a byte every 0.2 s, so no single read ever waits long. The SMTP
            # greeting never ends its line; the HTTP answer is valid but takes ~2 minutes.
            if self.behave == "smtp-trickle":
                data = b"220 " + b"x" * 1000 + b"\r\n"
            else:
                body = b'{"results": []}' + b" " * 600
                head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(body)}\r\n\r\n"
                data = head.encode() + body
            for i in range(len(data)):
                if self.stop.wait(0.2):
                    return
                try:
                    conn.sendall(data[i : i + 1])
                except OSError:  # the client gave up: good
                    return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def silent_smtp() -> Iterator[Peer]:
    peer = Peer("silent")
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def trickling_smtp() -> Iterator[Peer]:
    peer = Peer("smtp-trickle")
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def trickling_search() -> Iterator[Peer]:
    peer = Peer("http-trickle")
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def stuck_service(
    tmp_path_factory: pytest.TempPathFactory, silent_smtp: Peer, trickling_search: Peer
) -> Iterator[Service]:
    """SMTP that accepts and never speaks; a SearXNG endpoint that trickles its answer."""
    yield from make_service(
        tmp_path_factory.mktemp("stuck"),
        smtp_url=f"smtp://127.0.0.1:{silent_smtp.port}?from=bot@toolkiln.test",
        search_provider="searxng",
        search_url=f"http://127.0.0.1:{trickling_search.port}",
    )


@pytest.fixture(scope="module")
def trickle_smtp_service(
    tmp_path_factory: pytest.TempPathFactory, trickling_smtp: Peer
) -> Iterator[Service]:
    """SMTP whose greeting arrives a byte at a time and never ends."""
    yield from make_service(
        tmp_path_factory.mktemp("trickle"),
        smtp_url=f"smtp://127.0.0.1:{trickling_smtp.port}?from=bot@toolkiln.test",
    )


SEND_PY = """
def handle(input, ctx):
    return ctx.tools.send_email({"to": "me@example.org", "subject": "s", "body_text": "b"})
"""
SEARCH_PY = """
def handle(input, ctx):
    return ctx.tools.web_search({"query": "kilns"})
"""
SEND_JS = """
async function handle(input, ctx) {
  return await ctx.tools.send_email({ to: 'me@example.org', subject: 's', body_text: 'b' });
}
"""


def _answers_in_time(svc: Service, name: str, code: str, language: str = "python") -> dict:
    svc.policy(email_allowlist=["example.org"])
    tool = svc.tool(name, code, language=language, timeout_ms=TIMEOUT_MS)
    started = time.monotonic()
    res = svc.invoke(tool)
    wall_ms = (time.monotonic() - started) * 1000
    assert res["duration_ms"] < BOUND_MS and wall_ms < BOUND_MS, (wall_ms, res)
    # The built-in gave up inside the tool's time and said why; the tool got the envelope
    # and returned it, so the call itself is the tool's ordinary result, not a timeout.
    assert res["status"] == "ok" and res["error"] is None, (wall_ms, res["error"], res)
    envelope = res["raw_data"]
    assert envelope["error"] == "timeout", envelope
    assert "calling tool's time ran out" in envelope["details"]["message"], envelope
    stored = svc.client.get(f"/v1/custom-tools/{tool['id']}", headers=svc.headers).json()["data"]
    assert stored["failure_count"] == 0 and stored["status"] == "active", stored
    return res


def test_send_email_to_a_silent_smtp_server_ends_within_the_tools_time(
    stuck_service: Service, silent_smtp: Peer
) -> None:
    before = silent_smtp.accepted
    _answers_in_time(stuck_service, "silent-smtp", SEND_PY)
    assert silent_smtp.accepted == before + 1  # it did reach the server


def test_send_email_from_javascript_too(stuck_service: Service) -> None:
    _answers_in_time(stuck_service, "silent-smtp-js", SEND_JS, language="javascript")


def test_a_trickling_smtp_greeting_cannot_extend_the_call(trickle_smtp_service: Service) -> None:
    _answers_in_time(trickle_smtp_service, "trickle-smtp", SEND_PY)


def test_web_search_from_a_trickling_endpoint_ends_within_the_tools_time(
    stuck_service: Service, trickling_search: Peer
) -> None:
    before = trickling_search.accepted
    _answers_in_time(stuck_service, "trickle-search", SEARCH_PY)
    assert trickling_search.accepted == before + 1


def test_a_nested_tool_is_bounded_by_its_own_timeout(stuck_service: Service) -> None:
    """A tool called through ctx with a shorter timeout_ms than its caller's: the built-in
    it calls is bounded by the nested tool's time, not only by the root call's."""
    svc = stuck_service
    svc.policy(email_allowlist=["example.org"])
    svc.tool("inner-mailer", SEND_PY, timeout_ms=1500)
    outer = svc.tool(
        "outer-caller",
        'def handle(input, ctx):\n    return ctx.tools["inner-mailer"]({})\n',
        timeout_ms=20000,
    )
    started = time.monotonic()
    res = svc.invoke(outer)
    wall_ms = (time.monotonic() - started) * 1000
    assert wall_ms < 1500 + 3000, (wall_ms, res)
    assert res["status"] == "ok", res
    # The outer tool returned the nested call's {message, rawData, ...}: rawData is the
    # envelope the inner tool got from send_email.
    assert res["raw_data"]["error"] == "timeout", res
