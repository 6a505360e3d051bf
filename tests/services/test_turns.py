"""Turns on a transport's call threads (services/turns.py): a workspace holds at most all
but the reserve, a free thread goes to the workspace holding the fewest, a cancelled wait
leaves nothing held, and a workspace with its queue full is refused."""

from __future__ import annotations

import asyncio

import pytest

from toolkiln.domain.errors import TooManyRequests
from toolkiln.services.turns import UNVERIFIED, Turns, WorkspaceHints


async def _hold(turns: Turns, key: str, release: asyncio.Event, got: list[str]) -> None:
    async with turns.turn(key):
        got.append(key)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_workspace_leaves_the_reserve_to_others() -> None:
    async def scenario() -> None:
        turns = Turns(places=4, reserve=1)
        release, got = asyncio.Event(), []
        tasks = [asyncio.create_task(_hold(turns, "a", release, got)) for _ in range(6)]
        await _settle()
        assert got == ["a"] * 3 and turns.waiting("a") == 3
        other = asyncio.create_task(_hold(turns, "b", release, got))
        await _settle()
        assert got[-1] == "b" and turns.busy == 4
        release.set()
        await asyncio.gather(*tasks, other)
        assert turns.busy == 0 and turns.held == {}

    asyncio.run(scenario())


def test_a_free_thread_goes_to_the_workspace_holding_fewest() -> None:
    async def scenario() -> None:
        turns = Turns(places=2, reserve=0)
        first, rest, got = asyncio.Event(), asyncio.Event(), []
        a1 = asyncio.create_task(_hold(turns, "a", first, got))
        a2 = asyncio.create_task(_hold(turns, "a", rest, got))
        await _settle()
        waiting = [asyncio.create_task(_hold(turns, "a", rest, got)) for _ in range(3)]
        await _settle()
        b = asyncio.create_task(_hold(turns, "b", rest, got))  # came last, holds none
        await _settle()
        first.set()  # one of a's threads is free
        await _settle()
        assert got == ["a", "a", "b"]
        rest.set()
        await asyncio.gather(a1, a2, b, *waiting)
        assert turns.busy == 0

    asyncio.run(scenario())


def test_a_cancelled_wait_holds_nothing() -> None:
    async def scenario() -> None:
        turns = Turns(places=1, reserve=0)
        release, got = asyncio.Event(), []
        holder = asyncio.create_task(_hold(turns, "a", release, got))
        await _settle()
        waiter = asyncio.create_task(_hold(turns, "b", release, got))
        await _settle()
        waiter.cancel()
        release.set()  # the thread is free as the waiter is cancelled
        await asyncio.gather(holder, waiter, return_exceptions=True)
        assert turns.busy == 0 and turns.held == {} and turns.waiting() == 0
        again, got2 = asyncio.Event(), []
        again.set()
        await _hold(turns, "c", again, got2)
        assert got2 == ["c"]

    asyncio.run(scenario())


def test_a_full_queue_is_refused_at_once() -> None:
    async def scenario() -> None:
        turns = Turns(places=1, reserve=0, waiting=2)
        release, got = asyncio.Event(), []
        tasks = [asyncio.create_task(_hold(turns, "a", release, got)) for _ in range(3)]
        await _settle()
        with pytest.raises(TooManyRequests):
            await _hold(turns, "a", release, got)
        other = asyncio.create_task(_hold(turns, "b", release, got))  # b's queue is its own
        await _settle()
        assert turns.waiting("b") == 1
        release.set()
        await asyncio.gather(*tasks, other)

    asyncio.run(scenario())


def test_tokens_not_seen_share_one_small_turn() -> None:
    """Calls whose token this process has not seen share one key holding at most half the
    reserve: made-up or new tokens neither take the threads nor jump the queue."""
    hints = WorkspaceHints(size=2)
    assert hints.key("h1") == hints.key("h2") == UNVERIFIED
    hints.note("h1", "ws-a")
    hints.note("h2", "ws-b")
    assert hints.key("h1") == "ws-a"
    hints.note("h3", "ws-c")  # the oldest is forgotten
    assert hints.key("h1") == UNVERIFIED and hints.key("h3") == "ws-c"
    hints.forget("h3")  # a token the read refused
    assert hints.key("h3") == UNVERIFIED

    async def scenario() -> None:
        turns = Turns(places=8, reserve=4)
        release, got = asyncio.Event(), []
        junk = [asyncio.create_task(_hold(turns, UNVERIFIED, release, got)) for _ in range(10)]
        await _settle()
        assert turns.held == {UNVERIFIED: 2} and turns.waiting(UNVERIFIED) == 8
        real = asyncio.create_task(_hold(turns, "ws-b", release, got))
        await _settle()
        assert turns.held["ws-b"] == 1
        release.set()
        await asyncio.gather(*junk, real)

    asyncio.run(scenario())


def test_all_waiting_calls_are_bounded_too() -> None:
    async def scenario() -> None:
        turns = Turns(places=1, reserve=0, waiting=10, total_waiting=3)
        release, got = asyncio.Event(), []
        tasks = [asyncio.create_task(_hold(turns, f"ws-{i}", release, got)) for i in range(4)]
        await _settle()
        assert turns.waiting() == 3
        with pytest.raises(TooManyRequests):
            await _hold(turns, "ws-other", release, got)
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
