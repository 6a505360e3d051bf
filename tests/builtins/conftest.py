"""Real peers on loopback: an SMTP server (aiosmtpd, STARTTLS + AUTH) and search servers that
speak SearXNG's and Brave's protocols."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi.testclient import TestClient

from tests.conftest import free_port, own_service
from toolkiln.app import Runtime

SMTP_USER, SMTP_PASSWORD = "toolkiln", "smtp-secret"
BRAVE_KEY = "brave-test-key"


def self_signed(tmp: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return ctx


@dataclass
class Mailbox:
    messages: list[Message] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    got: threading.Event = field(default_factory=threading.Event)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        self.got.set()
        return "250 OK"


@dataclass
class SmtpServer:
    port: int
    mailbox: Mailbox

    @property
    def url(self) -> str:
        return (
            f"smtp://{SMTP_USER}:{SMTP_PASSWORD}@127.0.0.1:{self.port}"
            "?starttls=true&verify=false&from=bot@toolkiln.test"
        )


@pytest.fixture(scope="session")
def smtp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmtpServer]:
    mailbox = Mailbox()

    def authenticate(
        server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            SMTP_USER.encode(),
            SMTP_PASSWORD.encode(),
        )
        if ok:
            mailbox.logins.append(data.login.decode())
        return AuthResult(success=ok)

    port = free_port()
    controller = Controller(
        mailbox,
        hostname="127.0.0.1",
        port=port,
        tls_context=self_signed(tmp_path_factory.mktemp("tls")),
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    yield SmtpServer(port, mailbox)
    controller.stop()


class _Search(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        query = q.get("q", [""])[0]
        if query == "explode":
            self._send(500, {"error": "boom"})
        elif url.path == "/search" and q.get("format") == ["json"]:
            results = [
                {
                    "title": f"{query} {i}",
                    "url": f"https://example.org/{i}",
                    "content": f"about {query}",
                }
                for i in range(8)
            ]
            self._send(200, {"query": query, "results": results})
        elif url.path == "/res/v1/web/search":
            if self.headers.get("X-Subscription-Token") != BRAVE_KEY:
                self._send(401, {"error": "bad key"})
                return
            n = int(q.get("count", ["5"])[0])
            results = [
                {
                    "title": f"brave {query} {i}",
                    "url": f"https://brave.test/{i}",
                    "description": "d",
                }
                for i in range(n)
            ]
            self._send(200, {"web": {"results": results}})
        else:
            self._send(404, {})


@pytest.fixture(scope="session")
def search_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Search)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@dataclass
class Service:
    runtime: Runtime
    client: TestClient
    headers: dict[str, str]
    workspace_id: str

    def policy(self, **change: Any) -> None:
        r = self.client.patch(
            f"/v1/workspaces/{self.workspace_id}/policy", json=change, headers=self.headers
        )
        assert r.status_code == 200, r.text

    def builtin(self, name: str, payload: Any, **extra: Any) -> dict:
        r = self.client.post(
            f"/v1/builtin-tools/{name}/call", json={"input": payload, **extra}, headers=self.headers
        )
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def tool(self, name: str, code: str, **over: Any) -> dict:
        body = {
            "workspace_id": self.workspace_id,
            "name": name,
            "language": "python",
            "code": code,
            "input_schema": {"type": "object"},
            **over,
        }
        r = self.client.post("/v1/custom-tools", json=body, headers=self.headers)
        assert r.status_code == 201, r.text
        return r.json()["data"]

    def invoke(self, tool: dict, payload: Any = None, **extra: Any) -> dict:
        r = self.client.post(
            f"/v1/custom-tools/{tool['id']}/invoke",
            json={"input": payload or {}, **extra},
            headers=self.headers,
        )
        assert r.status_code == 200, r.text
        return r.json()["data"]


def make_service(tmp: Path, **settings: Any) -> Iterator[Service]:
    token = "tk_builtins-admin"
    with own_service(tmp, token, **settings) as (rt, client, who):
        yield Service(rt, client, {"Authorization": f"Bearer {token}"}, who.workspace_id)


@pytest.fixture(scope="module")
def outbox_service(tmp_path_factory: pytest.TempPathFactory, search_url: str) -> Iterator[Service]:
    """Embedded defaults (outbox, no SMTP) plus a SearXNG provider on loopback."""
    yield from make_service(
        tmp_path_factory.mktemp("outbox"), search_provider="searxng", search_url=search_url
    )


@pytest.fixture(scope="module")
def smtp_service(
    tmp_path_factory: pytest.TempPathFactory, smtp_server: SmtpServer, search_url: str
) -> Iterator[Service]:
    yield from make_service(
        tmp_path_factory.mktemp("smtp"),
        smtp_url=smtp_server.url,
        search_provider="brave",
        search_url=search_url,
        search_api_key=BRAVE_KEY,
    )
