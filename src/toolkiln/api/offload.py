"""Blocking work of the routes that run tools or long work, on thread pools of the app's own.

Two pools: ``app.state.offload`` for tool calls (invoke, agents' tool calls, built-in
calls) and ``app.state.work`` for routes that may start long work (generation, test cases
on create and PATCH, run-tests, ``/test``, run-code). Neither is anyio's default thread
limiter, on which FastAPI runs every sync route and the token check: a workspace that
sends slow work fills its own places (``services/places.py``) and, at most, these pools,
never the threads that answer other workspaces' reads (tests/security/test_slow_work.py).

FastAPI runs a sync route through anyio's thread hand-off (a capacity limiter, the async
library's detection, a shielded checkpoint, per request). For the route every tool call
takes, a plain executor hand-off measured ~0.1 ms less service CPU per call and a lower p50
with sequential calls; under 16 clients three A/B runs gave +10%, -3% and +5% calls/s
(within the noise; docs/decisions/111-invoke-route.md). The call's context variables go with it, as
with anyio; a call that has started runs to its end even when its client goes away (its
result is recorded), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from toolkiln.api.threads import LifoThreads
from toolkiln.services.container import Services
from toolkiln.services.turns import Turns

T = TypeVar("T")
# A call holds its thread while its tool runs (the Python sandbox runs at most 32 at once,
# JavaScript a few workers): room for those, and for calls waiting on the database.
THREADS = 64


# Threads of the work pool beyond the service's places for long work: for the requests on
# those routes that start none (a create without test cases) or are refused at once (429).
SHORT_WORK_THREADS = 16


def work_threads(services: Services) -> int:
    return services.places.config.total + SHORT_WORK_THREADS


# Threads of the call pool no one workspace may hold: other workspaces' calls always find
# one (services/turns.py; tests/security/test_slow_work.py).
RESERVE = THREADS // 4


class Offload:
    """A pool of threads; with ``reserve``, tool calls take turns on it by workspace."""

    def __init__(
        self, threads: int = THREADS, name: str = "toolkiln-call", reserve: int | None = None
    ) -> None:
        # the thread idle the shortest time runs the next call (api/threads.py)
        self._pool = LifoThreads(threads, name)
        self.turns = Turns(threads, reserve) if reserve is not None else None

    async def __call__(self, fn: Callable[..., T], *args: Any, turn: str | None = None) -> T:
        """``fn(*args)`` on a thread; with ``turn`` (a workspace id), once it is its turn."""
        loop = asyncio.get_running_loop()
        run = functools.partial(contextvars.copy_context().run, fn, *args)
        if self.turns is None or turn is None:
            return await loop.run_in_executor(self._pool, run)
        turns = self.turns
        await turns.acquire(turn)
        try:
            future = self._pool.submit(run)
        except BaseException:
            turns.release(turn)
            raise
        # The turn is the thread's: given back when the call ends, not when the request does
        # (a cancelled request leaves its call running on the thread).
        future.add_done_callback(lambda _: _on_loop(loop, turns.release, turn))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """No new calls; the ones running finish on their threads."""
        self._pool.shutdown(wait=False)


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed at shutdown: nothing waits
        loop.call_soon_threadsafe(fn, *args)
