"""The MCP watcher's PostgreSQL feed (storage/notify.py) gives up on a server that answers
the connection and then stops answering: its ``LISTEN`` waits at most the connect timeout,
then the feed fails and its supervisor opens it again. Before, a server that went quiet
between the connection and the ``LISTEN`` held the watcher for ever, and ``listChanged``
stopped on that replica (the outside review of the database freeze left this open).

The quiet server is the real one behind a proxy on loopback that passes the start-up
exchange (up to the server's first ReadyForQuery) and then drops what the client sends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import anyio
import pytest

from toolkiln.storage.notify import ListenFeed

READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery: the server waits for a query from here on


class GoesQuiet:
    """A TCP proxy to PostgreSQL that stops passing the client's bytes on once the server
    said it was ready: every query after the start-up goes unanswered."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.conns += [client, server]
            ready = threading.Event()
            for src, dst, from_server in ((server, client, True), (client, server, False)):
                args = (src, dst, ready, from_server)
                threading.Thread(target=self._pipe, args=args, daemon=True).start()

    def _pipe(
        self, src: socket.socket, dst: socket.socket, ready: threading.Event, from_server: bool
    ) -> None:
        seen = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if from_server:
                seen = (seen + data)[-4096:]
                if READY in seen:
                    ready.set()
            elif ready.is_set():
                continue  # the query is swallowed: the server never hears of it
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def quiet_postgres(postgres_url: str) -> Iterator[str]:
    head, _, rest = postgres_url.partition("@")
    hostport, _, database = rest.partition("/")
    host, _, port = hostport.partition(":")
    proxy = GoesQuiet((host, int(port or 5432)))
    yield f"{head}@127.0.0.1:{proxy.port}/{database}"
    proxy.close()


def test_listen_on_a_server_that_goes_quiet_after_connecting_fails_in_time(
    quiet_postgres: str,
) -> None:
    feed = ListenFeed(quiet_postgres, connect_timeout_s=2)

    async def first_wait() -> tuple[bool, BaseException | None]:
        raised: BaseException | None = None
        with anyio.move_on_after(15) as outer:  # far past the feed's own bound
            try:
                await feed.wait(1.0)
            except Exception as exc:
                raised = exc
        await feed.aclose()
        return outer.cancelled_caught, raised

    held, raised = anyio.run(first_wait)
    assert not held, "LISTEN waited for a server that had stopped answering"
    assert raised is not None  # the feed failed; the supervisor opens it again


def test_a_server_that_answers_is_listened_to(postgres_url: str) -> None:
    """The same feed on the server itself: connects, listens, then waits quietly."""
    feed = ListenFeed(postgres_url, connect_timeout_s=2)

    async def two_waits() -> None:
        await feed.wait(0.2)  # connects and listens
        await feed.wait(0.2)  # no notice: returns after the timeout
        await feed.aclose()

    anyio.run(two_waits)
