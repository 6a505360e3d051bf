"""Connections out of the service for ``http_request``: each host resolved once, every address
it resolves to judged, the connection made to that address.

httpcore asks its network backend for a TCP connection to the URL's host name and then starts
TLS on it with that same name (SNI, and the certificate checked against it), and httpx sends
that name in ``Host``. This backend answers with a connection to the address it resolved and
judged, so what was checked is what is reached: a name that resolves to a public address for
the check and to ``127.0.0.1`` a moment later (DNS rebinding) is never looked up twice.
tests/security/test_egress_addresses.py.

The byte cap and the deadline of every read and write are the outbound client's
(``outbound/http.py``: ``capped_transport`` over this backend, its streams ``deadline_bound``);
its pool holds one connection and keeps none, so a connection allowed under one workspace's
policy is never handed to another's request.
"""

from __future__ import annotations

import functools
import ipaddress
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx

from toolkiln.domain.egress import address_refusal
from toolkiln.outbound import lookup
from toolkiln.outbound.http import connect_first, deadline_bound

Resolve = Callable[[str, int, float], list[lookup.Address]]  # (host, port, until) -> addresses


class AddressRefused(Exception):
    """The host resolved to an address no request may reach under this policy."""

    def __init__(self, host: str, address: str, why: str) -> None:
        super().__init__(f"{host} resolves to {address}: {why}")
        self.host = host
        self.address = address
        self.why = why


class GuardedBackend(httpcore.NetworkBackend):
    """TCP connections to judged addresses, the lookup and the connect by ``until``
    (``time.monotonic()``). ``inner`` makes the connections (a test's stays on loopback)."""

    def __init__(
        self,
        until: float,
        private_ok: bool,
        resolve: Resolve = lookup.resolve,
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        self._inner = inner or httpcore.SyncBackend()
        self._until = until
        self._private_ok = private_ok
        self._resolve = resolve

    def _left(self, timeout: float | None) -> float:
        left = self._until - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("the request's time ran out")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        self._left(timeout)
        try:
            found = self._resolve(host, port, self._until)
        except lookup.LookupTimeout as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError:
            raise httpcore.ConnectError(f"{host} does not resolve") from None
        addresses = [str(sockaddr[0]).split("%")[0] for *_, sockaddr in found]
        for address in addresses:  # any address refused refuses the host
            why = address_refusal(ipaddress.ip_address(address), self._private_ok)
            if why is not None:
                raise AddressRefused(host, address, why)
        left = functools.partial(self._left, timeout)
        stream = connect_first(self._inner, host, addresses, port, left, None, socket_options)
        return deadline_bound(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("no unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def ssl_context(extra_ca_file: str | None = None) -> ssl.SSLContext:
    """Verified TLS (httpx's trust store), with the CAs of ``extra_ca_file`` trusted too."""
    context = httpx.create_ssl_context()
    if extra_ca_file:
        context.load_verify_locations(cafile=extra_ca_file)
    return context
