"""Fair shares of a pool of long-lived workers (or threads, or processes) between workspaces.

A call waits in a queue with its own deadline (then it is a ``timeout``, never an
``infra_error``). When a worker is free it goes to the waiting call whose workspace holds
the fewest workers, earliest first; and a workspace may hold at most all workers but one,
its nested runs included, so one workspace can never take every worker from the others
(a call that nests deeper than that waits within its deadline: its ``timeout`` is not
counted against the tool, which never got a process).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Waiter:
    ticket: int
    workspace: str


class FairShare:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.cap = max(1, workers - 1)  # per workspace, nested runs included
        self.held: dict[str, int] = {}
        self.busy = 0
        self._queue: list[_Waiter] = []
        self._tickets = itertools.count()
        self._cond = threading.Condition()

    def _next(self) -> _Waiter | None:
        """The waiter to serve when a worker is free."""
        best: tuple[tuple[int, int], _Waiter] | None = None
        for w in self._queue:
            held = self.held.get(w.workspace, 0)
            if held >= self.cap:
                continue
            key = (held, w.ticket)
            if best is None or key < best[0]:
                best = (key, w)
        return best[1] if best else None

    def acquire(self, workspace: str, deadline: float) -> bool:
        """Wait for this call's turn; False if its deadline came first."""
        with self._cond:
            me = _Waiter(next(self._tickets), workspace)
            self._queue.append(me)
            try:
                while not (self.busy < self.workers and self._next() is me):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                self.busy += 1
                self.held[workspace] = self.held.get(workspace, 0) + 1
                return True
            finally:
                self._queue.remove(me)
                self._cond.notify_all()

    def release(self, workspace: str) -> None:
        with self._cond:
            self.busy -= 1
            left = self.held.get(workspace, 0) - 1
            if left > 0:
                self.held[workspace] = left
            else:
                self.held.pop(workspace, None)
            self._cond.notify_all()

    def at_once(self, workspace: str) -> bool:
        """Whether a call of ``workspace`` arriving now would take its turn without waiting
        (nobody waits, a worker is free, the workspace is under its cap)."""
        with self._cond:
            return (
                not self._queue
                and self.busy < self.workers
                and self.held.get(workspace, 0) < self.cap
            )

    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)
