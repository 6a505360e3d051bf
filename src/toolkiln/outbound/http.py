"""An httpx client whose every answer is read with a byte cap and a deadline.

``capped_client(max_bytes=, total_s=)`` makes it; hand it to a library that takes an httpx
client (the OpenAI SDK's ``http_client=``) or use it directly. For each request:

- Deadline: every connect (the name's lookup included: ``outbound/lookup.py``), write and
  read waits at most until the request's deadline: ``total_s`` after it is sent, or sooner
  the deadline of an enclosing ``within(until)`` block (this thread's). httpcore's own
  timeouts bound each operation, not the whole, so without this an endpoint that trickles
  its answer a byte at a time stretched a request without end. Past it: ``httpx.ReadTimeout``
  (or the connect or write timeout).
- Byte cap: the body is counted as it comes off the wire, before httpx or the caller holds
  it. Past ``max_bytes`` reading stops, the connection is closed (never drained), and
  ``TooLarge`` (``outbound/cap.py``) is raised; with ``truncate=True`` the body ends at the
  cap instead and ``cap_of(response).truncated`` says so. A ``Content-Length`` over the cap
  is refused before any of the body is read.
- Encoding: the request asks for ``Accept-Encoding: identity``, and a compressed answer
  (which the cap on the wire would not bound once decoded) is refused: ``Compressed``.
- Only this transport: no proxy or ``.netrc`` from the environment (a proxy mount would
  route requests around the caps), no redirects.

tests/security/test_outside_reads.py and tests/builtins/test_deadline.py guard it.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from toolkiln.outbound import lookup
from toolkiln.outbound.cap import ByteCap, TooLarge

CAP_EXTENSION = "toolkiln.cap"

# The deadline (time.monotonic()) of the request being made in this context, if any.
_UNTIL: ContextVar[float | None] = ContextVar("toolkiln_outbound_until", default=None)


class Compressed(Exception):
    """The answer came compressed although ``identity`` was asked for."""


@dataclass(slots=True)
class CapState:
    """What the cap saw of one answer (``cap_of``)."""

    cap: ByteCap
    truncated: bool = False


def cap_of(response: httpx.Response) -> CapState | None:
    state = response.extensions.get(CAP_EXTENSION)
    return state if isinstance(state, CapState) else None


@contextmanager
def within(until: float) -> Iterator[None]:
    """Requests made in this block (in this thread) are over by ``until``
    (``time.monotonic()``), or sooner by their own ``total_s``."""
    current = _UNTIL.get()
    token = _UNTIL.set(until if current is None else min(current, until))
    try:
        yield
    finally:
        _UNTIL.reset(token)


def capped_client(*, max_bytes: int, total_s: float, truncate: bool = False) -> httpx.Client:
    transport = capped_transport(max_bytes=max_bytes, total_s=total_s, truncate=truncate)
    return httpx.Client(
        transport=transport, timeout=total_s, follow_redirects=False, trust_env=False
    )


def capped_transport(
    *,
    max_bytes: int,
    total_s: float,
    truncate: bool = False,
    backend: httpcore.NetworkBackend | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.BaseTransport:
    """The capped client's transport, for a caller that sends requests itself. ``backend``:
    what makes its connections (wrap each stream in ``deadline_bound``), in a pool of one
    connection that keeps none (``http_request``'s: builtins/reach.py); by default the
    shared pool over ``_UntilBackend``."""
    if backend is None:
        return _Capped(_until_transport(), max_bytes, total_s, truncate)
    context = ssl_context or httpx.create_ssl_context()
    inner = httpx.HTTPTransport(verify=context, retries=0)
    inner._pool = httpcore.ConnectionPool(
        ssl_context=context,
        max_connections=1,
        max_keepalive_connections=0,
        network_backend=backend,
    )
    return _Capped(inner, max_bytes, total_s, truncate)


def deadline_bound(stream: httpcore.NetworkStream) -> httpcore.NetworkStream:
    """``stream`` with every operation held to the running request's deadline."""
    return _UntilStream(stream)


class _Capped(httpx.BaseTransport):
    def __init__(
        self, inner: httpx.BaseTransport, max_bytes: int, total_s: float, truncate: bool
    ) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._total_s = total_s
        self._truncate = truncate

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        until = time.monotonic() + self._total_s
        ambient = _UNTIL.get()
        if ambient is not None:
            until = min(until, ambient)
        request.headers["Accept-Encoding"] = "identity"
        with within(until):
            response = self._inner.handle_request(request)
        state = CapState(ByteCap(self._max_bytes))
        try:
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise Compressed(f"the answer is {encoding}-encoded; identity was asked for")
            declared = response.headers.get("content-length", "")
            if not self._truncate and declared.isdigit() and int(declared) > self._max_bytes:
                raise TooLarge(self._max_bytes)
        except BaseException:
            response.close()
            raise
        response.extensions[CAP_EXTENSION] = state
        response.stream = _CappedStream(response.stream, state, until, self._truncate)
        return response

    def close(self) -> None:
        self._inner.close()


class _CappedStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, state: CapState, until: float, truncate: bool) -> None:
        self._inner = inner
        self._state = state
        self._until = until
        self._truncate = truncate

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        cap = self._state.cap
        while True:
            with within(self._until):  # each read of the body waits at most until then
                chunk = next(chunks, None)
            if chunk is None:
                return
            if self._truncate and len(chunk) > cap.room:
                rest = chunk[: cap.room]
                cap.seen += len(rest)
                self._state.truncated = True
                if rest:
                    yield rest
                return  # the caller's close() closes the connection mid-body
            cap.take(len(chunk))
            yield chunk

    def close(self) -> None:
        self._inner.close()


# -- every operation of a connection within the request's deadline


def _bounded(timeout: float | None, exc: type[httpcore.TimeoutException]) -> float | None:
    until = _UNTIL.get()
    if until is None:
        return timeout
    left = until - time.monotonic()
    if left <= 0:
        raise exc("the request's time ran out")
    return left if timeout is None else min(timeout, left)


class _UntilStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until the running request's
    deadline (httpcore applies a timeout to each read, not to the whole answer)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _UntilStream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


DEFAULT_CONNECT_S = 10.0  # a connection made outside any request's deadline


def connect_first(
    inner: httpcore.NetworkBackend,
    host: str,
    addresses: Iterable[str],
    port: int,
    left: Callable[[], float],
    local_address: str | None,
    socket_options: Iterable[Any] | None,
) -> httpcore.NetworkStream:
    """The first of a name's addresses that takes the connection, each tried in the order
    the lookup gave them within the time ``left()`` gives; all refusing raise the last error."""
    failure: httpcore.ConnectError | None = None
    for address in addresses:
        try:
            return inner.connect_tcp(address, port, left(), local_address, socket_options)
        except httpcore.ConnectError as exc:
            failure = exc
    raise failure if failure is not None else httpcore.ConnectError(f"{host!r} has no address")


class _UntilBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        until = time.monotonic() + (DEFAULT_CONNECT_S if bounded is None else bounded)
        try:  # the name's lookup within the time too (outbound/lookup.py)
            addresses = lookup.resolve(host, port, until)
        except lookup.LookupTimeout as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        found = [str(sockaddr[0]) for *_, sockaddr in addresses]
        stream = connect_first(
            self._inner,
            host,
            found,
            port,
            lambda: max(0.001, until - time.monotonic()),
            local_address,
            socket_options,
        )
        return _UntilStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _UntilStream(self._inner.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _until_transport() -> httpx.HTTPTransport:
    """httpx's transport over connections that are ``_UntilStream``s. httpx's transport
    takes no network backend, so its connection pool is made again with one (httpx is
    pinned, and tests/builtins/test_deadline.py fails if this stops holding)."""
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_UntilBackend(),
    )
    return transport
