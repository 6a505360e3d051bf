"""Looking up the peers the service talks to (the SMTP server, the search provider, the
model endpoint) within the caller's deadline.

``socket.create_connection`` and httpcore resolve a name with ``getaddrinfo``, which no
timeout bounds: a resolver that does not answer held the calling thread for the resolver's
own timeouts (5 s a try, two tries, each nameserver in turn), past the calling tool's
``timeout_ms``. Here a lookup runs on a few threads of its own and the caller waits for it
only until its deadline: a lookup that never ends holds one of those threads, never the
call, and lookups beyond them queue under the same deadline. A literal address is not
looked up at all.

Names a workspace chooses (``http_request``'s hosts) are looked up on threads of their own,
shared between workspaces fairly (``domain.fair``): a workspace whose names never resolve
holds at most all of them but one, each until the resolver gives up, and never the threads
that look up the service's own peers (tests/security/test_lookup_share.py: a workspace's
lookups of a zone whose name server never answered held the four threads every lookup
shared, and another workspace's ``http_request`` to a name answered at once timed out).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from toolkiln.domain.fair import FairShare

RESOLVERS = 4  # lookups at once; the ones that hang keep a thread each until the resolver gives up
WORKSPACE_RESOLVERS = 16  # lookups of names workspaces chose, at once, shared fairly

_pool = ThreadPoolExecutor(RESOLVERS, thread_name_prefix="toolkiln-dns")
_workspace_pool = ThreadPoolExecutor(WORKSPACE_RESOLVERS, thread_name_prefix="toolkiln-dns-ws")
_workspace_share = FairShare(WORKSPACE_RESOLVERS)

T = TypeVar("T")
Address = tuple[int, int, int, tuple[str, int] | tuple[str, int, int, int]]


class LookupTimeout(TimeoutError):
    """The name was not resolved before the deadline."""


def resolve(host: str, port: int, until: float, workspace: str | None = None) -> list[Address]:
    """The TCP addresses of ``host`` as ``(family, type, proto, sockaddr)``, in the
    resolver's order; ``LookupTimeout`` once ``until`` (``time.monotonic()``) passes, an
    ``OSError`` when the name does not resolve. ``workspace``: the workspace that chose the
    name (its lookups take their turn among the workspaces'); None for the service's own
    peers."""
    flags = socket.AI_NUMERICHOST if _is_literal(host) else 0
    if flags:
        return _addresses(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, flags))
    args = (host, port, 0, socket.SOCK_STREAM)
    try:
        if workspace is None:
            return _addresses(_bounded(socket.getaddrinfo, until, *args))
        return _addresses(_shared(workspace, socket.getaddrinfo, until, *args))
    except LookupTimeout:
        raise LookupTimeout(f"looking up {host!r} took longer than the time left") from None


def connect(host: str, port: int, until: float, source_address: Any = None) -> socket.socket:
    """A TCP connection to ``host``, the lookup and each attempt within ``until``: the
    addresses are tried in turn, like ``socket.create_connection``."""
    failure: OSError | None = None
    for family, kind, proto, sockaddr in resolve(host, port, until):
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"connecting to {host!r} took longer than the time left")
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            failure = exc
    raise failure if failure is not None else OSError(f"{host!r} has no address")


EHLO_LOOKUP_S = 0.5  # of a conversation's time, for this host's own name
EHLO_RETRY_S = 60.0  # after a lookup of it failed, the fallback is used this long

_ehlo: tuple[str, float] | None = None  # the name, and until when it is kept


def ehlo_name(until: float) -> str:
    """The name SMTP's EHLO gives for this host, as ``smtplib`` would choose it (its fully
    qualified name, else its address in brackets), but looked up for at most
    ``EHLO_LOOKUP_S`` and within ``until``: ``smtplib`` asks the resolver for it with no
    timeout, before connecting. Once found it is kept; while it cannot be, ``[127.0.0.1]``
    (``smtplib``'s own last resort) is given for ``EHLO_RETRY_S``."""
    global _ehlo
    now = time.monotonic()
    if _ehlo is not None and now < _ehlo[1]:
        return _ehlo[0]
    bound = min(until, now + EHLO_LOOKUP_S)
    try:
        fqdn = _bounded(socket.getfqdn, bound)
        if "." in fqdn:
            name = fqdn
        else:
            name = f"[{_bounded(socket.gethostbyname, bound, socket.gethostname())}]"
        _ehlo = (name, float("inf"))
    except OSError:
        _ehlo = ("[127.0.0.1]", now + EHLO_RETRY_S)
    return _ehlo[0]


def _bounded(fn: Callable[..., T], until: float, *args: Any) -> T:
    left = until - time.monotonic()
    if left <= 0:
        raise LookupTimeout("no time left for a name lookup")
    lookup = _pool.submit(fn, *args)
    try:
        return lookup.result(timeout=left)
    except FutureTimeout:
        lookup.cancel()  # still queued: never run; running: its thread finishes on its own
        raise LookupTimeout("a name lookup took longer than the time left") from None


def _shared(workspace: str, fn: Callable[..., T], until: float, *args: Any) -> T:
    """``fn`` on a thread of the workspaces' pool once this workspace's turn comes, within
    ``until``; its place is held until ``fn`` itself returns, not until the caller stops
    waiting (a lookup that hangs holds its thread so long)."""
    if not _workspace_share.acquire(workspace, until):
        raise LookupTimeout("no turn for a name lookup within the time left")

    def run() -> T:
        try:
            return fn(*args)
        finally:
            _workspace_share.release(workspace)

    try:
        lookup = _workspace_pool.submit(run)
    except BaseException:
        _workspace_share.release(workspace)
        raise
    try:
        return lookup.result(timeout=max(0.0, until - time.monotonic()))
    except FutureTimeout:
        raise LookupTimeout("a name lookup took longer than the time left") from None


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _addresses(infos: list[Any]) -> list[Address]:
    return [(family, kind, proto, sockaddr) for family, kind, proto, _, sockaddr in infos]
