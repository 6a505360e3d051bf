"""Turns on a transport's call threads, shared fairly between workspaces.

A tool call holds a thread while its tool runs, and while it waits for a sandbox place. The
threads a transport runs tool calls on (REST's call pool, MCP's ``tools/call``) are handed out
here before a call takes one:

- a workspace holds at most ``places - reserve`` of them: the rest are always other
  workspaces' (a sandbox place then goes to them first, by its own fair share);
- a free thread goes to the waiting call whose workspace holds the fewest, earliest first;
- a call waits for its turn on the event loop, holding no thread; a workspace with
  ``waiting`` calls queued already is refused at once (``TooManyRequests``, 429).

So one workspace sending many slow calls fills its own turns, never the threads other
workspaces' calls need (tests/security/test_slow_work.py). The turns are this process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from toolkiln.domain.errors import TooManyRequests

WAITING = 1024  # calls of one workspace queued for a turn before it is refused
RETRY_AFTER_S = 1


@dataclass(eq=False, slots=True)
class _Waiter:
    ticket: int
    key: str
    granted: asyncio.Future[None] = field(repr=False)


class Turns:
    def __init__(self, places: int, reserve: int, waiting: int = WAITING) -> None:
        if not 0 <= reserve < places:
            raise ValueError("reserve must leave a workspace at least one place")
        self.places = places
        self.cap = places - reserve  # per workspace
        self.waiting_cap = waiting
        self.held: dict[str, int] = {}
        self.busy = 0
        self._queue: list[_Waiter] = []
        self._tickets = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Hold one of the threads for ``key``'s workspace while the block runs."""
        await self._acquire(key)
        try:
            yield
        finally:
            self._release(key)

    def waiting(self, key: str | None = None) -> int:
        return sum(1 for w in self._queue if key is None or w.key == key)

    async def _acquire(self, key: str) -> None:
        if self.waiting(key) >= self.waiting_cap:
            raise TooManyRequests(
                "This workspace has too many tool calls waiting for a thread.",
                {"waiting": self.waiting_cap},
                retry_after_s=RETRY_AFTER_S,
            )
        me = _Waiter(next(self._tickets), key, asyncio.get_running_loop().create_future())
        self._queue.append(me)
        self._grant()
        try:
            await me.granted
        except BaseException:
            if me.granted.done() and not me.granted.cancelled():
                self._release(key)  # granted as it was cancelled: the turn goes on
            elif me in self._queue:
                self._queue.remove(me)
            raise

    def _release(self, key: str) -> None:
        self.busy -= 1
        left = self.held[key] - 1
        if left:
            self.held[key] = left
        else:
            del self.held[key]
        self._grant()

    def _grant(self) -> None:
        """Free threads to the waiting calls whose workspaces hold the fewest, in order."""
        # A waiter cancelled before its task ran again is no longer waiting.
        self._queue = [w for w in self._queue if not w.granted.cancelled()]
        while self.busy < self.places:
            best: _Waiter | None = None
            for w in self._queue:
                held = self.held.get(w.key, 0)
                if held >= self.cap:
                    continue
                if best is None or (held, w.ticket) < (self.held.get(best.key, 0), best.ticket):
                    best = w
            if best is None:
                return
            self._queue.remove(best)
            self.busy += 1
            self.held[best.key] = self.held.get(best.key, 0) + 1
            best.granted.set_result(None)


class WorkspaceHints:
    """The workspace a token hash was last authenticated for, to pick a call's turn before
    its thread reads the token (the read still decides: a revoked token is refused there).
    A token not seen yet takes turns as itself. The last ``size`` tokens are kept."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._seen: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, token_hash: str, workspace_id: str) -> None:
        with self._lock:
            self._seen[token_hash] = workspace_id
            self._seen.move_to_end(token_hash)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def key(self, token_hash: str) -> str:
        with self._lock:
            return self._seen.get(token_hash) or f"token:{token_hash}"
