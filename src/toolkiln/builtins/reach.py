"""Connections out of the service for ``http_request``: each host resolved once, every address
it resolves to judged, the connection made to that address, every operation within a deadline.

httpcore asks its network backend for a TCP connection to the URL's host name and then starts
TLS on it with that same name (SNI, and the certificate checked against it), and httpx sends
that name in ``Host``. This backend answers with a connection to the address it resolved and
judged, so what was checked is what is reached: a name that resolves to a public address for
the check and to ``127.0.0.1`` a moment later (DNS rebinding) is never looked up twice.
tests/security/test_egress_addresses.py.

A pool made with this backend belongs to one ``http_request`` call: a connection allowed under
one workspace's policy is never handed to another's request.
"""

from __future__ import annotations

import ipaddress
import ssl
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx

from toolkiln.domain.egress import address_refusal
from toolkiln.outbound import lookup as net

Resolve = Callable[[str, int, float], list[net.Address]]  # (host, port, until) -> addresses


class AddressRefused(Exception):
    """The host resolved to an address no request may reach under this policy."""

    def __init__(self, host: str, address: str, why: str) -> None:
        super().__init__(f"{host} resolves to {address}: {why}")
        self.host = host
        self.address = address
        self.why = why


def _left(until: float, timeout: float | None, exc: type[httpcore.TimeoutException]) -> float:
    left = until - time.monotonic()
    if left <= 0:
        raise exc("the request's time ran out")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until ``until`` (httpcore bounds each
    read, not the whole answer: a server that trickles a byte at a time cannot stretch it)."""

    def __init__(self, inner: httpcore.NetworkStream, until: float) -> None:
        self._inner = inner
        self._until = until

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(self._until, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(self._until, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._until, timeout, httpcore.ConnectTimeout)
        return DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, left), self._until
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """TCP connections to judged addresses, until a deadline (``time.monotonic()``)."""

    def __init__(
        self,
        until: float,
        private_ok: bool,
        resolve: Resolve = net.resolve,
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        self._inner = inner or httpcore.SyncBackend()
        self._until = until
        self._private_ok = private_ok
        self._resolve = resolve
        self.connected: list[str] = []  # the addresses connected to, in order

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        _left(self._until, timeout, httpcore.ConnectTimeout)
        try:
            found = self._resolve(host, port, self._until)
        except net.LookupTimeout as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError:
            raise httpcore.ConnectError(f"{host} does not resolve") from None
        addresses = [str(sockaddr[0]).split("%")[0] for *_, sockaddr in found]
        for address in addresses:  # any address refused refuses the host
            why = address_refusal(ipaddress.ip_address(address), self._private_ok)
            if why is not None:
                raise AddressRefused(host, address, why)
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            left = _left(self._until, timeout, httpcore.ConnectTimeout)
            try:
                stream = self._inner.connect_tcp(address, port, left, None, socket_options)
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            self.connected.append(address)
            return DeadlineStream(stream, self._until)
        raise failure if failure is not None else httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("no unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def transport(backend: GuardedBackend, ssl_context: ssl.SSLContext) -> httpx.HTTPTransport:
    """An httpx transport over ``backend``: one connection at a time, none kept after the
    call. httpx's transport takes no network backend, so its pool is made again with one
    (httpx is pinned; tests/egress/test_http_request.py fails if this stops holding)."""
    made = httpx.HTTPTransport(verify=ssl_context, retries=0)
    made._pool = httpcore.ConnectionPool(
        ssl_context=ssl_context,
        max_connections=1,
        max_keepalive_connections=0,
        network_backend=backend,
    )
    return made


def ssl_context(extra_ca_file: str | None = None) -> ssl.SSLContext:
    """Verified TLS (httpx's trust store), with the CAs of ``extra_ca_file`` trusted too."""
    context = httpx.create_ssl_context()
    if extra_ca_file:
        context.load_verify_locations(cafile=extra_ca_file)
    return context


def read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """The answer's body decoded (gzip, deflate), at most ``cap`` bytes of it: a small
    compressed answer cannot grow past the cap in memory."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    decoder = None
    if encoding in ("gzip", "x-gzip"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        decoder = zlib.decompressobj()
    chunks: list[bytes] = []
    size = 0
    for chunk in response.stream:  # type: ignore[union-attr]
        if decoder is not None:
            chunk = decoder.decompress(chunk, cap + 1 - size)
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            return b"".join(chunks)[:cap], True
    if decoder is not None:
        chunks.append(decoder.flush(cap + 1 - size))
        if size + len(chunks[-1]) > cap:
            return b"".join(chunks)[:cap], True
    return b"".join(chunks), False
