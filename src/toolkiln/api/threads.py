"""A pool of threads that gives work to the thread idle the shortest time, and ends threads
left idle for ``IDLE_S``.

``concurrent.futures.ThreadPoolExecutor`` keeps every thread it ever started, all waiting on
one queue, and the one woken for the next piece of work is not the one that just finished:
after a burst of concurrent calls, a service's sequential calls ran on 7 threads in turn
instead of 1, and its Python cost ~10-60% more CPU per call in alternating py-spy passes
(docs/benchmarks.md, cost flat over time). Here an idle thread waits on a lock of its own
on a stack: the last one to go idle is the first one woken (tests/api/test_threads.py).
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

IDLE_S = 30.0  # a thread idle this long ends (the pool starts one again when needed)

_Work = tuple[Future[Any], Callable[[], Any]]


class _Idle:
    """An idle thread's place on the stack: ``work`` is handed in, then ``wake`` released."""

    __slots__ = ("idle", "wake", "work")

    def __init__(self) -> None:
        self.work: _Work | None = None
        self.idle = False  # on the stack (else, with no work, the thread ends)
        self.wake = threading.Lock()
        self.wake.acquire()


class LifoThreads(Executor):
    def __init__(self, threads: int, name: str, idle_s: float = IDLE_S) -> None:
        self._max = threads
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []  # the last to go idle on top
        self._queued: collections.deque[_Work] = collections.deque()  # all threads busy
        self._threads = 0
        self._made = 0
        self._shutdown = False

    @property
    def threads(self) -> int:
        """Threads alive now, busy or idle."""
        with self._lock:
            return self._threads

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        work: _Work = (future, functools.partial(fn, *args, **kwargs))
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                idle = self._idle.pop()
                idle.work = work
                idle.wake.release()
                return future
            if self._threads >= self._max:
                self._queued.append(work)
                return future
            self._threads += 1
            self._made += 1
            name = f"{self._name}_{self._made - 1}"
        threading.Thread(target=self._run, args=(work,), name=name, daemon=True).start()
        return future

    def _run(self, work: _Work | None) -> None:
        me = _Idle()
        while work is not None:
            future, fn = work
            work = None
            if future.set_running_or_notify_cancel():
                failed: BaseException | None = None
                try:
                    value = fn()
                except BaseException as exc:  # the caller's, as ThreadPoolExecutor does
                    failed = exc
                # Back on the stack before the caller hears of it: its next piece of work
                # finds this thread, not one idle longer.
                with self._lock:
                    work = self._next_or_idle(me)
                if failed is None:
                    future.set_result(value)
                else:
                    future.set_exception(failed)
                del failed
            else:
                with self._lock:
                    work = self._next_or_idle(me)
            del future, fn
            if work is None and me.idle:
                work = self._wait(me)
        with self._lock:
            self._threads -= 1

    def _next_or_idle(self, me: _Idle) -> _Work | None:
        """Under the lock: the queued work to run next, or ``me`` put on the stack."""
        if self._queued:
            return self._queued.popleft()
        me.work, me.idle = None, not self._shutdown
        if me.idle:
            self._idle.append(me)
        return None

    def _wait(self, me: _Idle) -> _Work | None:
        """The work handed to ``me``; None to end (idle for ``idle_s``, or shut down)."""
        woken = me.wake.acquire(timeout=self._idle_s)
        with self._lock:
            if not woken:
                if me in self._idle:
                    self._idle.remove(me)
                    return None
                me.wake.acquire()  # handed work as the wait ended: released already
            return me.work

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new work; idle threads end, busy ones after their work and what is queued.
        ``wait`` is not supported beyond that (the service's pools never wait)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queued:
                    self._queued.popleft()[0].cancel()
            idle, self._idle = self._idle, []
        for one in idle:
            one.work = None
            one.wake.release()
