"""Background loops (the MCP list-change watcher and its feed) run under one supervisor.

A loop that raises is logged, reported by ``/healthz`` and started again after a backoff
(doubling, capped); its failure never ends the task group it runs in, so a database blip
cannot end the app's lifespan and close the sandbox pools while the server keeps serving.
Cancellation (shutdown) is not an ``Exception`` and passes straight through.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

log = logging.getLogger("toolkiln.background")

FIRST_DELAY_S = 0.2
MAX_DELAY_S = 10.0

# A loop receives ``healthy``, which it calls once it works (again): after a restart the
# backoff starts over and /healthz stops reporting the last error.
Loop = Callable[[Callable[[], None]], Awaitable[None]]


@dataclass(slots=True)
class LoopState:
    """What /healthz says about one loop."""

    running: bool = False
    healthy: bool = False
    restarts: int = 0
    last_error: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.healthy else "degraded",
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class Supervisor:
    """Keeps named loops running; ``run`` returns only when the loop returns or is cancelled."""

    def __init__(self, first_delay_s: float = FIRST_DELAY_S, max_delay_s: float = MAX_DELAY_S):
        self._first = first_delay_s
        self._max = max_delay_s
        self.loops: dict[str, LoopState] = {}

    async def run(self, name: str, loop: Loop) -> None:
        state = self.loops.setdefault(name, LoopState())
        delay = self._first

        def healthy() -> None:
            nonlocal delay
            state.healthy, state.last_error, delay = True, None, self._first

        state.running = True
        try:
            while True:
                try:
                    await loop(healthy)
                    return
                except Exception as exc:
                    state.healthy = False
                    state.restarts += 1
                    state.last_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                    log.warning("%s failed (%s); restarting in %.1fs", name, exc, delay)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, self._max)
        finally:
            state.running = False

    def health(self) -> dict[str, Any]:
        return {name: state.view() for name, state in self.loops.items() if state.running}


class ChangeFeed(Protocol):
    """Wakes a watcher when tool lists may have changed on any replica.

    ``wait`` returns when told of a change or after ``timeout_s`` (the watcher then checks
    the database's change marker, which stays the truth: a notice lost while reconnecting
    is caught by the next check). It raises when its connection fails; the supervisor
    restarts the loop. ``aclose`` drops any connection it holds.
    """

    async def wait(self, timeout_s: float) -> None: ...

    async def aclose(self) -> None: ...


def periodic(task: Callable[[], int], every_s: float, done: str, logger: logging.Logger) -> Loop:
    """A loop that runs ``task`` (blocking; it answers how much it did) at start and then
    every ``every_s``, on a thread of its own (never queued behind requests for the shared
    threads), logging ``done % count`` when it did something."""

    async def loop(healthy: Callable[[], None]) -> None:
        own = anyio.CapacityLimiter(1)
        while True:
            count = await anyio.to_thread.run_sync(task, limiter=own)
            if count:
                logger.info(done, count)
            healthy()
            await anyio.sleep(every_s)

    return loop
