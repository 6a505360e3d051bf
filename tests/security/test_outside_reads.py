"""Everything read from outside is read with a byte cap and a deadline (issue 37).

A model endpoint, a search provider and an SMTP server that answer without end cost the
service at most the cap: reading stops there, with a clear error (``llm_unavailable``
reason ``too_large``; the search's and the mail's ``too_large``), and the servers, real ones
on loopback, count what they managed to send: the cap plus what the sockets' buffers hold,
never the whole answer. An endpoint that trickles its answer past the deadline is cut off
at it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import own_service
from tests.model_server import ScriptedModel, huge, trickle
from toolkiln.builtins.email import SMTP_MAX_REPLY_BYTES
from toolkiln.builtins.search import SEARCH_MAX_BYTES

TOKEN = "tk_outside-reads-admin-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
MODEL_CAP = 1024 * 1024  # TOOLKILN_LLM_MAX_ANSWER_BYTES for these tests
ANSWER = 128 * 1024 * 1024  # what each server would send, as fast as it is read
# Between what a server wrote and what the service read: the two sockets' buffers on
# loopback (a few MiB each at most), and a read in progress.
BUFFERS = 24 * 1024 * 1024


class _Counter:
    def __init__(self) -> None:
        self.sent = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def add(self, n: int) -> None:
        with self.lock:
            self.sent += n


def _search_server(counter: _Counter) -> ThreadingHTTPServer:
    class Endless(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            item = b'{"title": "t", "url": "https://example.org/", "content": "' + b"x" * 8000
            parts = [b'{"results": [', *[item + b'"},'] * (ANSWER // len(item)), item + b'"}]}']
            try:
                for part in parts:
                    self.wfile.write(part)
                    counter.add(len(part))
            except OSError:  # the client stopped reading
                pass
            finally:
                counter.done.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _smtp_server(counter: _Counter) -> socket.socket:
    """Greets with a reply of endless continuation lines ("220-..."), each under smtplib's
    limit for a line, then waits for the client to hang up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        line = b"220-" + b"x" * 1000 + b"\r\n"
        try:
            for _ in range(ANSWER // len(line)):
                conn.sendall(line)
                counter.add(len(line))
            conn.recv(1)  # the client gives up (or reads on until its deadline)
        except OSError:
            pass
        finally:
            conn.close()
            counter.done.set()

    threading.Thread(target=serve, daemon=True).start()
    return listener


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


def test_a_model_answer_over_the_cap_is_llm_unavailable_too_large(
    tmp_path: Path, model: ScriptedModel
) -> None:
    settings = {
        "llm_base_url": model.url,
        "llm_model": "scripted",
        "llm_max_answer_bytes": MODEL_CAP,
        "llm_timeout_s": 60,
    }
    with own_service(tmp_path, TOKEN, **settings) as (_, client, who):
        model.script(huge(ANSWER))
        body = {"workspace_id": who.workspace_id, "description": "anything"}
        r = client.post("/v1/custom-tools/generate", json=body, headers=HEADERS)

    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "llm_unavailable"
    assert error["details"] == {"reason": "too_large", "max_bytes": MODEL_CAP}
    assert model.sent_bytes < MODEL_CAP + BUFFERS


def test_a_model_answer_that_trickles_past_the_deadline_is_cut_off(
    tmp_path: Path, model: ScriptedModel
) -> None:
    settings = {"llm_base_url": model.url, "llm_model": "scripted", "llm_timeout_s": 2}
    with own_service(tmp_path, TOKEN, **settings) as (_, client, who):
        model.script(trickle())
        body = {"workspace_id": who.workspace_id, "description": "anything"}
        r = client.post("/v1/custom-tools/generate", json=body, headers=HEADERS)
    assert model.wait_hanging(0)  # it had started answering
    assert r.status_code == 502, r.text
    assert r.json()["error"]["details"] == {"reason": "timeout"}
    # The read itself stopped at the deadline: the connection was closed, not left reading.
    assert model.wait_dropped(20)


def test_a_search_answer_over_the_cap_is_a_provider_error(tmp_path: Path) -> None:
    counter = _Counter()
    server = _search_server(counter)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        settings = {"search_provider": "searxng", "search_url": url}
        with own_service(tmp_path, TOKEN, **settings) as (_, client, _who):
            r = client.post(
                "/v1/builtin-tools/web_search/call",
                json={"input": {"query": "anything"}},
                headers=HEADERS,
            )
        assert r.status_code == 200, r.text
        answer = r.json()["data"]
        assert answer["error"] == "provider_failed"
        assert answer["details"] == {"reason": "too_large", "max_bytes": SEARCH_MAX_BYTES}
        assert counter.done.wait(30)
        assert counter.sent < SEARCH_MAX_BYTES + BUFFERS
    finally:
        server.shutdown()


def test_smtp_replies_over_the_cap_are_a_delivery_failure(tmp_path: Path) -> None:
    counter = _Counter()
    listener = _smtp_server(counter)
    port = listener.getsockname()[1]
    try:
        with own_service(tmp_path, TOKEN, smtp_url=f"smtp://127.0.0.1:{port}") as (
            _,
            client,
            who,
        ):
            policy = {"email_allowlist": ["example.org"]}
            client.patch(f"/v1/workspaces/{who.workspace_id}/policy", json=policy, headers=HEADERS)
            mail = {"to": "a@example.org", "subject": "s", "body_text": "b"}
            r = client.post(
                "/v1/builtin-tools/send_email/call", json={"input": mail}, headers=HEADERS
            )
        assert r.status_code == 200, r.text
        answer = r.json()["data"]
        assert answer["error"] == "delivery_failed", answer
        assert answer["details"] == {"reason": "too_large", "max_bytes": SMTP_MAX_REPLY_BYTES}
        assert counter.done.wait(30)
        assert counter.sent < SMTP_MAX_REPLY_BYTES + BUFFERS
    finally:
        listener.close()
