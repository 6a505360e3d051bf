"""A built-in's peers are looked up within the calling call's time (outbound/lookup.py): a
resolver that never answers cannot hold a call past its ``timeout_ms``, nor hold up the
mail a tool sends to a server named by its address (``smtplib`` looks this host's own name
up for EHLO, without a timeout).

The resolver is made to hang for one process only: tests/builtins/dns_stall.py runs in a
mount namespace of its own where /etc/resolv.conf names a loopback nameserver that reads
nothing and /etc/hosts has only localhost. Without the bound each lookup there waits for
glibc's timeouts (3 s a try, 2 tries)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builtins.conftest import SmtpServer
from tests.builtins.dns_stall import TIMEOUT_MS
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
# resolv.conf can name a server's address but not its port (53 always), so the silent
# server takes port 53 on a loopback address no one else holds: one picked at random (the
# whole of 127/8 is loopback), another if that one is taken (another run of this test).
NAMESERVER_TRIES = 50
BOUND_MS = TIMEOUT_MS + 2000  # a behavioural bound: glibc alone would take 6 s a lookup

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a mount namespace of its own (unshare -m) needs root and util-linux's unshare",
)


@pytest.fixture(scope="module")
def silent_nameserver() -> Iterator[str]:
    """UDP and TCP port 53 bound and never read, on a loopback address of their own (its
    value): every query waits for its timeout."""
    for _ in range(NAMESERVER_TRIES):
        address = f"127.53.{secrets.randbelow(256)}.{1 + secrets.randbelow(254)}"
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            udp.bind((address, 53))
            tcp.bind((address, 53))
        except OSError:  # held by someone else: another address
            udp.close()
            tcp.close()
            continue
        tcp.listen(1)
        try:
            yield address
        finally:
            udp.close()
            tcp.close()
        return
    pytest.fail(f"no loopback address had port 53 free in {NAMESERVER_TRIES} tries")


def _stalled(tmp: Path, nameserver: str, smtp_url: str, search_url: str) -> dict:
    (tmp / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:3 attempts:2\n")
    (tmp / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    script = (
        f"mount --bind {tmp / 'resolv.conf'} /etc/resolv.conf && "
        f"mount --bind {tmp / 'hosts'} /etc/hosts && "
        f'exec "$0" -m tests.builtins.dns_stall "$1" "$2"'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            sys.executable,
            smtp_url,
            search_url,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_peers_that_cannot_be_looked_up_end_within_the_tools_time(
    tmp_path: Path, silent_nameserver: str
) -> None:
    out = _stalled(
        tmp_path,
        silent_nameserver,
        "smtp://mail.dns-stall.test:25?from=bot@toolkiln.test",
        "http://search.dns-stall.test:8080",
    )
    for name in ("mail", "search"):
        call = out[name]
        res = call["result"]
        assert call["wall_ms"] < BOUND_MS and res["duration_ms"] < BOUND_MS, (name, call)
        # The built-in gave up inside the tool's time and said so; the tool returned it.
        assert res["status"] == "ok" and res["error"] is None, (name, res)
        assert res["raw_data"]["error"] == "timeout", (name, res)
        assert "calling tool's time ran out" in res["raw_data"]["details"]["message"], res


def test_mail_to_a_server_named_by_its_address_goes_while_the_resolver_hangs(
    tmp_path: Path, silent_nameserver: str, smtp_server: SmtpServer
) -> None:
    """Only the EHLO name needs the resolver here; it is given up on, and the mail sent."""
    out = _stalled(tmp_path, silent_nameserver, smtp_server.url, f"http://127.0.0.1:{free_port()}")
    call = out["mail"]
    res = call["result"]
    assert call["wall_ms"] < BOUND_MS, call
    assert res["status"] == "ok" and res["raw_data"].get("error") is None, res
    assert any(m["Subject"] == "s" for m in smtp_server.mailbox.messages), smtp_server.mailbox
