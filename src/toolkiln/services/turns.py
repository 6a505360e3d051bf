"""Turns on a transport's call threads, shared fairly between workspaces.

A tool call holds a thread while its tool runs, and while it waits for a sandbox place. The
threads a transport runs tool calls on (REST's call pool, MCP's ``tools/call``) are handed out
here before a call takes one:

- a workspace holds at most ``places - reserve`` of them: the rest are always other
  workspaces' (a sandbox place then goes to them first, by its own fair share);
- calls whose workspace is not known before their thread reads the token (a token this
  process has not seen yet) share one key, ``UNVERIFIED``, which holds at most half the
  reserve: a burst of new or made-up tokens cannot take the threads, nor jump the queue as
  many keys holding none;
- a free thread goes to the waiting call whose workspace holds the fewest, earliest first;
- a call waits for its turn on the event loop, holding no thread; a workspace with
  ``waiting`` calls queued already, or a process with ``total_waiting``, is refused at once
  (``TooManyRequests``, 429).

So one workspace sending many slow calls fills its own turns, never the threads other
workspaces' calls need (tests/security/test_slow_work.py, tests/services/test_turns.py).
The turns are this process's, and not thread-safe: used from the event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from toolkiln.domain.errors import TooManyRequests

WAITING = 1024  # calls of one workspace queued for a turn before it is refused
TOTAL_WAITING = 4096  # calls of all workspaces queued
RETRY_AFTER_S = 1
UNVERIFIED = "unverified"  # the key of calls whose token this process has not seen yet


@dataclass(eq=False, slots=True)
class _Waiter:
    ticket: int
    key: str
    granted: asyncio.Future[None] = field(repr=False)


class Turns:
    def __init__(
        self, places: int, reserve: int, waiting: int = WAITING, total_waiting: int = TOTAL_WAITING
    ) -> None:
        if not 0 <= reserve < places:
            raise ValueError("reserve must leave a workspace at least one place")
        self.places = places
        self.cap = places - reserve  # per workspace
        self.unverified_cap = max(1, reserve // 2)
        self.waiting_cap = waiting
        self.total_waiting = total_waiting
        self.held: dict[str, int] = {}
        self.busy = 0
        self._queue: list[_Waiter] = []
        self._waiting: Counter[str] = Counter()
        self._tickets = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Hold one of the threads for ``key``'s workspace while the block runs."""
        await self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def waiting(self, key: str | None = None) -> int:
        return len(self._queue) if key is None else self._waiting[key]

    def _cap(self, key: str) -> int:
        return self.unverified_cap if key == UNVERIFIED else self.cap

    async def acquire(self, key: str) -> None:
        """Wait for ``key``'s turn; ``release(key)`` once its thread is done."""
        if self._waiting[key] >= self.waiting_cap or len(self._queue) >= self.total_waiting:
            raise TooManyRequests(
                "Too many tool calls are waiting for a thread.",
                {"waiting": self.waiting_cap},
                retry_after_s=RETRY_AFTER_S,
            )
        me = _Waiter(next(self._tickets), key, asyncio.get_running_loop().create_future())
        self._queue.append(me)
        self._waiting[key] += 1
        self._grant()
        try:
            await me.granted
        except BaseException:
            if me.granted.done() and not me.granted.cancelled():
                self.release(key)  # granted as it was cancelled: the turn goes on
            else:
                self._leave(me)
            raise

    def release(self, key: str) -> None:
        self.busy -= 1
        left = self.held[key] - 1
        if left:
            self.held[key] = left
        else:
            del self.held[key]
        self._grant()

    def _leave(self, waiter: _Waiter) -> None:
        if waiter in self._queue:
            self._queue.remove(waiter)
            self._waiting[waiter.key] -= 1
            if not self._waiting[waiter.key]:
                del self._waiting[waiter.key]

    def _grant(self) -> None:
        """Free threads to the waiting calls whose workspaces hold the fewest, in order."""
        # A waiter cancelled before its task ran again is no longer waiting.
        for gone in [w for w in self._queue if w.granted.cancelled()]:
            self._leave(gone)
        while self.busy < self.places:
            best: _Waiter | None = None
            for w in self._queue:
                held = self.held.get(w.key, 0)
                if held >= self._cap(w.key):
                    continue
                if best is None or (held, w.ticket) < (self.held.get(best.key, 0), best.ticket):
                    best = w
            if best is None:
                return
            self._leave(best)
            self.busy += 1
            self.held[best.key] = self.held.get(best.key, 0) + 1
            best.granted.set_result(None)


class WorkspaceHints:
    """The workspace a token hash was last authenticated for, to pick a call's turn before
    its thread reads the token (the read still decides: a refused token is forgotten here).
    A token not seen yet takes the ``UNVERIFIED`` turn. The last ``size`` tokens are kept."""

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

    def forget(self, token_hash: str) -> None:
        with self._lock:
            self._seen.pop(token_hash, None)

    def key(self, token_hash: str) -> str:
        with self._lock:
            return self._seen.get(token_hash, UNVERIFIED)
