"""Class: slow work of one workspace cannot starve another, for ``http_request``.

``http_request`` looks up the host a tool (or a model) names, and a workspace chooses those
names: one under a zone whose name server never answers holds the lookup for the
resolver's whole timeout, past the calling call's deadline (outbound/lookup.py). Workspace
A's calls to such names must not make workspace B's lookups wait behind them.

Real parts throughout: a ``toolkiln serve`` process in a mount namespace of its own whose
``/etc/resolv.conf`` names a DNS server of the test's (UDP, on a loopback address of its
own), which answers every name but those under ``slow.test``, and never those; glibc's own
resolver in the service. B's lookup is answered (``b.test`` is a loopback address, which
the policy refuses: ``egress_denied`` says so, which only a finished lookup can say).
"""

from __future__ import annotations

import http.server
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, own_service, serving
from tests.reliability.harness import TOOLKILN, wait_for

ADMIN = "tk_lookup-share-admin-token"
FLOOD = 12  # A's calls at once, each naming a host under the silent zone
READ_S = 120.0  # a bound on one request, never an expectation

NAMESPACE = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the service's own /etc/resolv.conf needs a mount namespace: root and unshare",
)


@dataclass
class Dns:
    """A DNS server on UDP port 53 of a loopback address of its own: an A record of
    127.0.0.1 for every name, no answer at all for names under ``slow.test``."""

    address: str
    silent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.address, 53))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            name, end = _qname(packet)
            qtype = int.from_bytes(packet[end : end + 2], "big")
            if name == "slow.test" or name.endswith(".slow.test"):
                self.silent.append(name)
                continue
            question = packet[12 : end + 4]
            answers = b""
            if qtype == 1:
                answers = b"\xc0\x0c" + (1).to_bytes(2, "big") + (1).to_bytes(2, "big")
                answers += (60).to_bytes(4, "big") + (4).to_bytes(2, "big") + bytes([127, 0, 0, 1])
            header = (
                packet[:2] + b"\x81\x80" + b"\x00\x01" + (1 if answers else 0).to_bytes(2, "big")
            )
            self.sock.sendto(header + b"\x00\x00\x00\x00" + question + answers, peer)

    def close(self) -> None:
        self.sock.close()


def _qname(packet: bytes) -> tuple[str, int]:
    labels, i = [], 12
    while packet[i]:
        labels.append(packet[i + 1 : i + 1 + packet[i]].decode("ascii", "replace"))
        i += 1 + packet[i]
    return ".".join(labels).lower(), i + 1


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Dns]]:
    dns = Dns(f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {dns.address}\noptions timeout:30 attempts:1\n")
    port = free_port()
    env = {
        **os.environ,
        "TOOLKILN_DATA_DIR": str(tmp_path / "data"),
        "TOOLKILN_BOOTSTRAP_TOKEN": ADMIN,
        "TOOLKILN_SANDBOX_WARM": "2",
        "TOOLKILN_SANDBOX_JS_WORKERS": "1",
    }
    log = (tmp_path / "serve.log").open("wb")
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$1" serve --port "$2"'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    proc = subprocess.Popen(
        [*command, str(resolv), TOOLKILN, str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for("serve", ready, 120)
        yield base, dns
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
        dns.close()


def _workspace(
    http: httpx.Client, name: str, egress: list[str], egress_private: bool = False
) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    ws = http.post("/v1/workspaces", json={"name": name}, headers=admin)
    assert ws.status_code == 201, ws.text
    wid = ws.json()["data"]["id"]
    body = {"workspace_id": wid, "scopes": ["read", "write", "invoke"]}
    token = http.post("/v1/tokens", json=body, headers=admin)
    assert token.status_code == 201, token.text
    headers = {"Authorization": f"Bearer {token.json()['data']['token']}"}
    policy = http.patch(
        f"/v1/workspaces/{wid}/policy",
        json={"egress": egress, "egress_private": egress_private},
        headers=headers,
    )
    assert policy.status_code == 200, policy.text
    return headers


def _fetch(http: httpx.Client, headers: dict[str, str], url: str, timeout_ms: int) -> dict:
    body = {"input": {"method": "GET", "url": url, "timeout_ms": timeout_ms}}
    r = http.post("/v1/builtin-tools/http_request/call", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json()["data"])


@NAMESPACE
def test_names_that_never_resolve_leave_another_workspace_its_lookups(
    service: tuple[str, Dns],
) -> None:
    base, dns = service
    with httpx.Client(base_url=base, timeout=READ_S) as http:
        a = _workspace(http, "lookup-a", ["*.slow.test"])
        b = _workspace(http, "lookup-b", ["b.test"])

        def flood(i: int) -> None:
            with httpx.Client(base_url=base, timeout=READ_S) as own:
                _fetch(own, a, f"http://n{i}.slow.test/", 1000)

        threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(FLOOD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(READ_S)
        # A's calls have answered (their time was up); their lookups may still be waiting.
        wait_for("A's lookups to reach the name server", lambda: len(set(dns.silent)) >= 4)
        result = _fetch(http, b, "http://b.test/", 10_000)
    assert result["error"] is not None, result
    assert result["error"] == "egress_denied", result
    assert "127.0.0.1" in str(result), result


class _Held(http.server.BaseHTTPRequestHandler):
    """Answers ``/held`` only once the test lets it (``released``), ``/`` at once."""

    released = threading.Event()
    arrived: list[str] = []

    def do_GET(self) -> None:
        if self.path == "/held":
            type(self).arrived.append(self.path)
            type(self).released.wait(READ_S)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def test_requests_held_by_a_slow_server_leave_another_workspace_its_requests(
    tmp_path: Path,
) -> None:
    """A's ``http_request`` calls to a server that holds its answers take the process's
    request slots; B's request to a server that answers at once is sent and answered, not
    refused ``busy``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Held)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    where = f"127.0.0.1:{server.server_address[1]}"
    _Held.released.clear()
    _Held.arrived.clear()
    with own_service(tmp_path, ADMIN) as (rt, _, _), serving(rt) as base:
        with httpx.Client(base_url=base, timeout=READ_S) as client:
            a = _workspace(client, "slots-a", [where], egress_private=True)
            b = _workspace(client, "slots-b", [where], egress_private=True)

            def flood() -> None:
                with httpx.Client(base_url=base, timeout=READ_S) as own:
                    _fetch(own, a, f"http://{where}/held", 30_000)

            threads = [threading.Thread(target=flood, daemon=True) for _ in range(2 * 16)]
            try:
                for t in threads:
                    t.start()
                wait_for("A's requests to hold the slots", lambda: len(_Held.arrived) >= 15)
                result = _fetch(client, b, f"http://{where}/", 10_000)
            finally:
                _Held.released.set()
                for t in threads:
                    t.join(READ_S)
                server.shutdown()
    assert result.get("error") is None, result
    assert result["status"] == 200, result
