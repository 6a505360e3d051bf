"""Attacks on http_request's URL: a host that hides another (NUL and control characters, a
user-info part), an address in a form the egress list cannot name (decimal, octal, hex,
short, IPv6-mapped), an IP literal outside the list. Each is ``egress_denied`` and the server
it points at sees no connection."""

from __future__ import annotations

import pytest

from tests.egress.kit import Kit
from tests.egress.servers import Running

# The tool puts a NUL where the URL says <NUL>: a call's input holds none (it is refused at
# the door), so it can only come from the tool's own code.
NUL_TOOL = (
    "def main(*, ctx, **params):\n"
    "    request = dict(params['request'], url=params['request']['url'].replace('<NUL>', chr(0)))\n"
    "    return {'message': 'done', 'rawData': ctx.tools.http_request(request)}\n"
)


@pytest.fixture
def allowed(kit: Kit, http: Running) -> str:
    """A tool that may reach ``localhost`` on the server's port only."""
    kit.policy(egress_private=True)
    body = {
        "workspace_id": kit.space.id,
        "name": "nul-maker",
        "language": "python",
        "code": NUL_TOOL,
        "input_schema": {"type": "object"},
        "egress": [f"localhost:{http.port}"],
    }
    r = kit.client.post("/v1/custom-tools", json=body, headers=kit.rw)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


@pytest.mark.parametrize(
    "host",
    [
        "localhost<NUL>.example.com",
        "localhost%00.example.com",
        "local\thost",
        "localhost\r\nX-Injected: 1",
        "user:pass@localhost",
        "localhost@127.0.0.1",
        "localhost\\@127.0.0.1",  # httpx reads a backslash as the end of the authority
        "127.0.0.1",
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::1]",
        "LOCALHOST",  # the same name: allowed (a control, below)
    ],
)
def test_hosts_that_are_not_the_listed_name(
    kit: Kit, http: Running, allowed: str, host: str
) -> None:
    url = f"http://{host}:{http.port}/json"
    got = kit.answer(allowed, {"method": "GET", "url": url})
    if host == "LOCALHOST":
        assert got.get("status") == 200, got
        return
    # A NUL is refused at the built-in's door (no input to any tool holds one): the host
    # never sees it. Every other host is judged and refused as not the listed one.
    refusals = {"egress_denied", "invalid_input"} if "<NUL>" in host else {"egress_denied"}
    assert got["error"] in refusals, got
    assert http.seen.connections == 0


def test_userinfo_after_the_port_is_refused(kit: Kit, http: Running, allowed: str) -> None:
    url = f"http://localhost:{http.port}@127.0.0.1:{http.port}/json"
    got = kit.answer(allowed, {"method": "GET", "url": url})
    assert got["error"] == "egress_denied" and http.seen.connections == 0


def test_schemes_other_than_http_are_refused(kit: Kit, http: Running, allowed: str) -> None:
    for url in ("file:///etc/passwd", f"ftp://localhost:{http.port}/", "gopher://localhost/"):
        got = kit.answer(allowed, {"method": "GET", "url": url})
        assert got["error"] == "egress_denied", url
    assert http.seen.connections == 0


def test_a_secret_may_not_choose_the_host(kit: Kit, http: Running, allowed: str) -> None:
    kit.secret("HOST", "localhost", [f"localhost:{http.port}"])
    url = f"http://{{{{secrets.HOST}}}}:{http.port}/json"
    got = kit.answer(allowed, {"method": "GET", "url": url})
    assert got["error"] == "secret_not_allowed" and http.seen.connections == 0


def test_a_header_cannot_smuggle_a_line(kit: Kit, http: Running, allowed: str) -> None:
    url = f"http://localhost:{http.port}/json"
    got = kit.answer(allowed, {"method": "GET", "url": url, "headers": {"X": "a\r\nHost: b"}})
    assert got["error"] == "invalid_input" and http.seen.connections == 0


def test_the_host_header_is_the_url_s(kit: Kit, http: Running, allowed: str) -> None:
    url = f"http://localhost:{http.port}/echo"
    got = kit.answer(allowed, {"method": "GET", "url": url, "headers": {"Host": "evil.test"}})
    assert got["json"]["headers"]["host"] == f"localhost:{http.port}"
