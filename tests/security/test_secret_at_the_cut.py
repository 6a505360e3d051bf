"""Class: credentials never reach what a caller is shown.

``http_request`` fills ``{{secrets.NAME}}`` toward the secret's hosts and masks the secret's
value wherever the answer echoes it. An answer is cut at 512 KiB: a caller who pads what a
host reflects (here, request headers echoed back, as many debugging endpoints do) can place
the secret across the cut, where no whole value is left to mask, and read all of it but its
last character. The answer shown must hold no part of a secret that was sent.

A real HTTP server on loopback (the secret's host, which only reflects what it is sent), the
service's own http_request over its API.
"""

from __future__ import annotations

import http.server
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import free_port, own_service
from toolkiln.builtins.http import MAX_ANSWER_BYTES

ADMIN = "tk_secret-at-the-cut-admin"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
VALUE = "s3cr3t-" + secrets.token_hex(12)


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers each request with its headers, one ``name: value`` line each, in order, then
    the path it was asked for."""

    def do_GET(self) -> None:
        lines = [f"{k}: {v}\n" for k, v in self.headers.items()] + [f"path: {self.path}\n"]
        body = "".join(lines).encode()
        self.send_response(200)
        self.send_header("X-Echo", self.headers.get("X-Q", "") + self.path)
        if self.headers.get("X-Name"):  # a header named as the request asks
            self.send_header(self.headers["X-Name"], "1")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _call(client: TestClient, url: str, headers: dict[str, str]) -> dict:
    body = {"input": {"method": "GET", "url": url, "headers": headers, "timeout_ms": 10_000}}
    r = client.post("/v1/builtin-tools/http_request/call", json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data.get("error") is None, data
    return dict(data)


def _with_secrets(client: TestClient, ws: str, echo: str, named: dict[str, str]) -> None:
    r = client.patch(
        f"/v1/workspaces/{ws}/policy",
        json={"egress": [echo], "egress_private": True},
        headers=HEADERS,
    )
    assert r.status_code == 200, r.text
    for name, value in named.items():
        r = client.post(
            f"/v1/workspaces/{ws}/secrets",
            json={"name": name, "value": value, "hosts": [echo]},
            headers=HEADERS,
        )
        assert r.status_code == 201, r.text


def test_a_secret_across_the_cut_is_not_shown_in_part(tmp_path: Path, echo: str) -> None:
    with own_service(tmp_path, ADMIN) as (_, client, who):
        _with_secrets(client, who.workspace_id, echo, {"KEY": VALUE})
        base = f"http://{echo}/?k="
        pads = {f"X-Pad-{i}": "x" * 8192 for i in range(63)}
        # Where the secret lands in the echo, measured with a marker first.
        probe = _call(client, base + "MARK", pads)
        assert probe["truncated"] is False
        at = probe["body"].encode().index(b"MARK")
        grow = MAX_ANSWER_BYTES - at - (len(VALUE) - 1) - len("p=&")  # all but its last character
        assert 0 < grow < 8000, grow
        url = f"http://{echo}/?p={'a' * grow}&k={{{{secrets.KEY}}}}"
        answer = _call(client, url, pads)
    assert answer["truncated"] is True
    shown = answer["body"]
    assert VALUE not in shown
    assert not any(VALUE[:n] in shown for n in range(8, len(VALUE))), shown[-80:]


def test_a_secret_across_a_header_cut_is_not_shown_in_part(tmp_path: Path, echo: str) -> None:
    """A header of the answer is shown up to 8,192 characters: one that echoes the secret
    across that cut shows none of it either."""
    with own_service(tmp_path, ADMIN) as (_, client, who):
        _with_secrets(client, who.workspace_id, echo, {"KEY": VALUE})
        lead = f"/?k={'{{secrets.KEY}}'}"
        pad = "q" * (8192 - len("/?k=") - (len(VALUE) - 1))  # all but its last character
        answer = _call(client, f"http://{echo}{lead}", {"X-Q": pad})
    shown = answer["headers"]["x-echo"]
    assert VALUE not in shown
    assert not any(VALUE[:n] in shown for n in range(8, len(VALUE))), shown[-80:]


def test_a_secret_inside_another_does_not_unmask_it(tmp_path: Path, echo: str) -> None:
    """A secret whose value is part of another's, named first, masked first, broke every
    echo of the longer one, which was then shown but for that part."""
    with own_service(tmp_path, ADMIN) as (_, client, who):
        _with_secrets(client, who.workspace_id, echo, {"A_PART": VALUE[:6], "Z_KEY": VALUE})
        url = f"http://{echo}/?a={{{{secrets.A_PART}}}}&k={{{{secrets.Z_KEY}}}}"
        answer = _call(client, url, {})
    shown = answer["body"] + str(answer["headers"])
    assert VALUE[6:] not in shown, shown[-200:]
    assert "{{secrets.Z_KEY}}" in shown


def test_a_header_named_as_a_secret_is_masked(tmp_path: Path, echo: str) -> None:
    """A host that names a header of its answer after what it was sent (HTTP lowercases
    header names) shows the secret in no case."""
    with own_service(tmp_path, ADMIN) as (_, client, who):
        _with_secrets(client, who.workspace_id, echo, {"KEY": VALUE.upper()})
        answer = _call(client, f"http://{echo}/", {"X-Name": "{{secrets.KEY}}"})
    names = " ".join(answer["headers"])
    assert VALUE.lower() not in names and VALUE.upper() not in names, names
