"""Real HTTP and HTTPS servers on loopback for the egress tests: each records the connections
it accepted and the requests it read, and answers by path.

- ``/echo``: the request as JSON (method, path, headers, body).
- ``/json``: ``{"ok": true}``.
- ``/big?n=N``: N bytes of text.
- ``/gzip?n=N``: N bytes of "a", gzip-compressed (a small answer that grows).
- ``/slow``: headers, then one byte every 50 ms for ever (until the client leaves).
- ``/redirect?to=URL&code=302``: a redirect.
"""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    connections: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _record(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
        }
        self.server.seen.requests.append(seen)
        return seen

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _any(self) -> None:
        seen = self._record()
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/echo":
            self._send(200, json.dumps(seen).encode(), {"content-type": "application/json"})
        elif url.path == "/json":
            self._send(200, b'{"ok": true}', {"content-type": "application/json"})
        elif url.path == "/big":
            self._send(200, b"x" * int(query["n"]), {"content-type": "text/plain"})
        elif url.path == "/gzip":
            packed = gzip.compress(b"a" * int(query["n"]))
            self._send(200, packed, {"content-type": "text/plain", "content-encoding": "gzip"})
        elif url.path == "/slow":
            self.send_response(200)
            self.send_header("content-length", "1000000")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
        elif url.path == "/redirect":
            code = int(query.get("code", "302"))
            self._send(code, b"", {"location": query["to"]})
        else:
            self._send(404, b"no such path")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen = Seen()
        self._context = context

    def get_request(self) -> Any:
        sock, address = super().get_request()
        self.seen.connections += 1
        if self._context is not None:
            sock.settimeout(5)
            try:
                sock = self._context.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                sock.close()
                raise
        return sock, address


@dataclass
class Running:
    port: int
    seen: Seen
    scheme: str

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


@contextmanager
def server(context: ssl.SSLContext | None = None) -> Iterator[Running]:
    made = _Server(context)
    thread = threading.Thread(target=made.serve_forever, daemon=True)
    thread.start()
    try:
        yield Running(made.server_address[1], made.seen, "https" if context else "http")
    finally:
        made.shutdown()
        made.server_close()
