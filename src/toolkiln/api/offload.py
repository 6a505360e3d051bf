"""The invoke route's blocking work, run on a thread pool of the app's own.

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
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
# A call holds its thread while its tool runs (the Python sandbox runs at most 32 at once,
# JavaScript a few workers): room for those, and for calls waiting on the database.
THREADS = 64


class Offload:
    def __init__(self, threads: int = THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="toolkiln-call")

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        run = functools.partial(contextvars.copy_context().run, fn, *args)
        return await loop.run_in_executor(self._pool, run)

    def close(self) -> None:
        """No new calls; the ones running finish on their threads."""
        self._pool.shutdown(wait=False)
