"""Change feeds for the MCP list-change watcher: PostgreSQL ``LISTEN``, or a poll for SQLite.

On PostgreSQL a trigger on the audit table (migration 0008) sends ``NOTIFY`` on the channel
below for every row that can change some agent's tool list, so every replica's watcher wakes
at once, whichever replica (or CLI) made the change. SQLite has no such thing: the watcher
polls, which only sees replicas sharing the file.
"""

from __future__ import annotations

import contextlib

import anyio
import psycopg

from toolkiln.services.background import ChangeFeed
from toolkiln.storage.database import KEEPALIVE_ARGS

CHANNEL = "toolkiln_tool_lists"
POLL_S = 1.0
# With LISTEN the check on timeout is only a safety net.
LISTEN_FALLBACK_S = 30.0


class PollFeed:
    """Wakes the watcher every second."""

    async def wait(self, timeout_s: float) -> None:
        await anyio.sleep(min(timeout_s, POLL_S))

    async def aclose(self) -> None:
        return None


class ListenFeed:
    """``LISTEN`` on a connection of its own, opened on first use and after a failure."""

    def __init__(self, url: str, connect_timeout_s: int = 5) -> None:
        self._dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._timeout = connect_timeout_s
        # Keepalives, so that a connection to a host that is gone fails (and is opened
        # again) instead of listening for ever; the URL's own settings win.
        given = psycopg.conninfo.conninfo_to_dict(self._dsn)
        self._keepalive = {k: v for k, v in KEEPALIVE_ARGS.items() if k not in given}
        self._conn: psycopg.AsyncConnection | None = None

    async def wait(self, timeout_s: float) -> None:
        if self._conn is None or self._conn.closed:
            # The LISTEN is bounded too: a server that accepted the connection and then
            # stopped answering held the watcher for ever (keepalives see a host that is
            # gone, not one that is frozen).
            conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=self._timeout, **self._keepalive
            )
            try:
                with anyio.fail_after(self._timeout):
                    await conn.execute(f"LISTEN {CHANNEL}")
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.close()
                raise
            self._conn = conn
            return  # listening from now on; the caller checks what it may have missed
        try:
            wait = min(timeout_s, LISTEN_FALLBACK_S)
            async for _ in self._conn.notifies(timeout=wait, stop_after=1):
                pass  # one notice or several, it is one more look for the watcher
        except Exception:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def feed_for(url: str) -> ChangeFeed:
    return PollFeed() if url.startswith("sqlite") else ListenFeed(url)
