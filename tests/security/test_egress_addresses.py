"""Attacks on where http_request connects: a name that resolves to a private address (once
for the check and again for the connection: DNS rebinding), IPv4 inside IPv6, the cloud
metadata address (refused even where private addresses are allowed), and a redirect toward
any of them. The resolver is the built-in's seam, pointed at loopback only."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from typing import Any

import httpcore
import pytest
import trustme

from tests.egress.kit import Kit
from tests.egress.servers import Running, server
from toolkiln.builtins.http import HttpRequest
from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure
from toolkiln.domain.records import Policy
from toolkiln.domain.secrets import Secret


class NoSecrets:
    def for_request(self, workspace_id: str, names: list[str]) -> dict[str, Secret]:
        return {}

    def used(self, workspace_id: str, names: list[str]) -> None:
        pass


class Resolver:
    """Answers a lookup of a name with the next of its addresses (the last one repeats), of
    an address with itself; every lookup is kept in ``asked``."""

    def __init__(self, **names: str | list[str]) -> None:
        self.names = {
            k.replace("_", "."): [v] if isinstance(v, str) else v for k, v in names.items()
        }
        self.asked: list[str] = []

    def __call__(self, host: str, port: int, until: float) -> list[Any]:
        seen = self.asked.count(host)
        self.asked.append(host)
        answers = self.names.get(host, [host])
        address = answers[min(seen, len(answers) - 1)]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, (address, port))]


class LoopbackOnly(httpcore.NetworkBackend):
    """Connects to loopback addresses only: were a judged address let through wrongly, the
    test fails here instead of sending anything off this machine."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self.refused: list[str] = []

    def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        if not ipaddress.ip_address(host).is_loopback:
            self.refused.append(host)
            raise httpcore.ConnectError(f"the test connects to loopback only, not {host}")
        return self._inner.connect_tcp(host, port, *args, **kwargs)


def _tool(resolver: Resolver, **seams: Any) -> tuple[HttpRequest, LoopbackOnly]:
    network = LoopbackOnly()
    return HttpRequest(NoSecrets(), resolve=resolver, network=network, **seams), network


def _call(egress: list[str], private_ok: bool) -> BuiltinCall:
    policy = Policy(egress_private=private_ok)
    return BuiltinCall("ws", policy, "code", deadline=time.monotonic() + 5, egress=tuple(egress))


def _request(tool: HttpRequest, url: str, call: BuiltinCall) -> Any:
    try:
        return tool.call({"method": "GET", "url": url}, call)
    except BuiltinFailure as failure:
        return failure


def test_a_name_resolving_to_a_private_address_is_refused(http: Running) -> None:
    resolver = Resolver(api_test="127.0.0.1")
    tool, _ = _tool(resolver)
    got = _request(tool, http.url("/json", "api.test"), _call([f"api.test:{http.port}"], False))
    assert isinstance(got, BuiltinFailure) and got.code == "egress_denied"
    assert got.details["host"] == "api.test" and "127.0.0.1" in got.details["reason"]
    assert http.seen.connections == 0


def test_the_name_is_resolved_once_and_that_address_is_used(http: Running) -> None:
    """The first answer is judged and connected to; a second lookup would have said
    otherwise (a rebinding name), and is never made."""
    resolver = Resolver(api_test=["127.0.0.1", "169.254.169.254"])
    tool, _ = _tool(resolver)
    got = _request(tool, http.url("/echo", "api.test"), _call([f"api.test:{http.port}"], True))
    assert got["status"] == 200 and resolver.asked == ["api.test"]
    assert got["json"]["headers"]["host"] == f"api.test:{http.port}"


def test_tls_keeps_the_name_while_connecting_to_the_address(ca: trustme.CA) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.test").configure_cert(context)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment]
    client = ssl.create_default_context()
    ca.configure_trust(client)
    tool, _ = _tool(Resolver(api_test="127.0.0.1"), context=client)
    with server(context) as https:
        got = _request(
            tool, https.url("/json", "api.test"), _call([f"api.test:{https.port}"], True)
        )
    assert got["json"] == {"ok": True} and names == ["api.test"]


@pytest.mark.parametrize(
    "address", ["::ffff:127.0.0.1", "64:ff9b::7f00:1", "::ffff:169.254.169.254", "100.64.0.1"]
)
def test_addresses_carried_or_shared_are_judged_as_what_they_are(
    http: Running, address: str
) -> None:
    tool, network = _tool(Resolver(api_test=address))
    got = _request(tool, http.url("/json", "api.test"), _call([f"api.test:{http.port}"], False))
    assert isinstance(got, BuiltinFailure) and got.code == "egress_denied"
    assert http.seen.connections == 0 and network.refused == []


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "100.100.100.200"])
def test_metadata_addresses_are_refused_even_where_private_ones_are_allowed(
    address: str,
) -> None:
    tool, network = _tool(Resolver(metadata_test=address))
    got = _request(tool, "http://metadata.test/latest/", _call(["metadata.test"], True))
    assert isinstance(got, BuiltinFailure) and got.code == "egress_denied"
    assert "metadata" in got.details["reason"] and network.refused == []


def test_a_redirect_to_metadata_is_refused(http: Running) -> None:
    """The redirect names the metadata service by a name and by its IPv4-mapped address;
    private addresses are allowed (the first hop is loopback), metadata never is."""
    resolver = Resolver(api_test="127.0.0.1", metadata_test="169.254.169.254")
    tool, network = _tool(resolver)
    egress = [f"api.test:{http.port}", "metadata.test", "[::ffff:a9fe:a9fe]"]
    for to in ("http://metadata.test/latest/", "http://[::ffff:a9fe:a9fe]/latest/"):
        url = http.url(f"/redirect?to={to}", "api.test")
        got = _request(tool, url, _call(egress, True))
        assert isinstance(got, BuiltinFailure) and got.code == "egress_denied", to
        assert "metadata" in got.details["reason"]
    assert network.refused == [] and len(http.seen.requests) == 2


def test_a_redirect_off_the_list_is_refused(kit: Kit, http: Running) -> None:
    kit.policy(egress_private=True)
    tool = kit.tool("python", [f"127.0.0.1:{http.port}"])
    to = f"http://localhost:{http.port}/json"
    got = kit.answer(tool, {"method": "GET", "url": http.url(f"/redirect?to={to}")})
    assert got["error"] == "egress_denied" and got["details"]["host"] == "localhost"
    assert len(http.seen.requests) == 1  # the redirecting hop only


def test_no_connection_serves_a_second_request(http: Running) -> None:
    """No connection outlives its request: one allowed under one workspace's policy can
    never serve another's (the server keeps connections alive; each request opens its own)."""
    tool, _ = _tool(Resolver(api_test="127.0.0.1"))
    call = _call([f"api.test:{http.port}"], True)
    for _ in range(2):
        assert _request(tool, http.url("/json", "api.test"), call)["status"] == 200
    hop = http.url("/redirect?to=/json&code=307", "api.test")
    assert _request(tool, hop, call)["json"] == {"ok": True}
    assert http.seen.connections == 4
