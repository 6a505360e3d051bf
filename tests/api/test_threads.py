"""The call pool (api/threads.py): after a burst, sequential work runs on the thread idle the
shortest time, not on each of the burst's threads in turn; idle threads end; at most
``threads`` run at once and the rest wait their turn; failures reach the caller."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from toolkiln.api.threads import LifoThreads


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def burst(pool: LifoThreads, n: int) -> None:
    """``n`` pieces of work at once, each holding its thread until all have started."""
    started, go = threading.Barrier(n + 1), threading.Event()

    def hold() -> None:
        started.wait(10)
        go.wait(10)

    futures = [pool.submit(hold) for _ in range(n)]
    started.wait(10)
    go.set()
    for f in futures:
        f.result(10)


def test_after_a_burst_sequential_work_stays_on_one_thread() -> None:
    pool = LifoThreads(16, "t")
    try:
        burst(pool, 8)
        assert pool.threads == 8
        ran_on = {pool.submit(threading.get_ident).result(10) for _ in range(200)}
        # ThreadPoolExecutor: the 8 threads in turn
        assert len(ran_on) == 1, ran_on
    finally:
        pool.shutdown()


def test_idle_threads_end_and_the_pool_starts_them_again() -> None:
    pool = LifoThreads(16, "t", idle_s=0.05)
    try:
        burst(pool, 6)
        wait_for(lambda: pool.threads == 0, "the idle threads ended")
        assert pool.submit(lambda: 42).result(10) == 42
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_at_most_threads_at_once_and_the_rest_wait() -> None:
    pool = LifoThreads(3, "t")
    gate, lock = threading.Event(), threading.Lock()
    running, most, order = [0], [0], []

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(10)
        with lock:
            running[0] -= 1
            order.append(i)
        return i

    try:
        futures = [pool.submit(work, i) for i in range(10)]
        wait_for(lambda: running[0] == 3, "three running")
        assert pool.threads == 3
        gate.set()
        assert [f.result(10) for f in futures] == list(range(10))
        assert most[0] == 3
        assert sorted(order) == list(range(10))
    finally:
        pool.shutdown()


def test_a_failure_reaches_the_caller_and_the_thread_serves_on() -> None:
    pool = LifoThreads(2, "t")
    try:
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(10)
        assert pool.submit(lambda: "after").result(10) == "after"
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_after_shutdown_nothing_new_and_idle_threads_end() -> None:
    pool = LifoThreads(4, "t")
    burst(pool, 3)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 1)
    wait_for(lambda: pool.threads == 0, "the idle threads ended at shutdown")
