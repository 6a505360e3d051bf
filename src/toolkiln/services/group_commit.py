"""Group commit: the records of calls that end at the same time, written in one transaction.

Every call ends with one write (its counters, its stored Result, its audit rows). Under
concurrency those writes queue for the database's writer anyway (SQLite has one; on
PostgreSQL each commit waits for its WAL flush), so the caller that finds no batch being
written writes every write queued so far in one transaction, and wakes their callers when it
has committed. No caller returns before the transaction holding its write has committed: a
call is never acknowledged before its record is committed (how durable a commit is, is the
database's: docs/configuration.md). Alone, a write is a transaction of
its own, as before.

A write that fails must not take the others with it: when a batch fails (a conflict, a bug in
one write) it is rolled back and each of its writes is retried in a transaction of its own,
so the error is that write's alone and nothing half-written stays. A database that cannot be
reached fails the whole batch at once (retrying each would only wait out each connect
timeout again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.services.ports import UnitOfWork, UnitOfWorkFactory

Write = Callable[[UnitOfWork], Any]
MAX_BATCH = 64


class _Pending:
    __slots__ = ("error", "finished", "key", "value", "wake", "write")

    def __init__(self, write: Write, key: str) -> None:
        self.write = write
        self.key = key
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None
        # Released exactly once: when its batch has committed, or when it is to write the
        # next batch (so each waiting caller is woken once, never all of them for each batch).
        self.wake = threading.Lock()
        self.wake.acquire()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class GroupCommit:
    def __init__(self, uow: UnitOfWorkFactory, max_batch: int = MAX_BATCH) -> None:
        self._uow = uow
        self._max = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._writing = False
        self.batches = 0  # transactions tried, and the writes they held: for tests
        self.writes = 0

    def run(self, write: Write, key: str = "") -> Any:
        """``write(tx)`` in a committed transaction, maybe with other callers' writes; its
        return value, or its exception. ``key`` names the row the write locks (a tool's id):
        a batch is written in key order, so two batches (of two replicas on one PostgreSQL)
        lock rows in the same order and cannot deadlock each other."""
        mine = _Pending(write, key)
        with self._lock:
            self._queue.append(mine)
            leading = not self._writing
            self._writing = True
        if not leading:
            try:
                mine.wake.acquire()  # its write committed (or failed), or it writes next
            except BaseException:  # interrupted while waiting: never strand the others
                self._abandon(mine)
                raise
            if mine.finished:
                return mine.outcome()
        try:
            while not mine.finished:
                with self._lock:
                    batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                self._commit(batch, mine)
        finally:
            self._hand_over()
        return mine.outcome()

    def waiting(self) -> int:
        """Writes queued behind the batch being written."""
        with self._lock:
            return len(self._queue)

    def _hand_over(self) -> None:
        """The writer is done: the first write still queued writes next, if any."""
        with self._lock:
            if self._queue:
                self._queue[0].wake.release()
            else:
                self._writing = False

    def _abandon(self, mine: _Pending) -> None:
        with self._lock:
            if mine.finished:
                return
            handed = mine.wake.acquire(blocking=False)  # it was to write the next batch
            if mine in self._queue:
                self._queue.remove(mine)
        if handed:
            self._hand_over()

    def _commit(self, batch: list[_Pending], mine: _Pending) -> None:
        """Write ``batch``; every write in it ends finished and its caller woken, once."""
        self.batches += 1
        self.writes += len(batch)
        try:
            self._write(batch, mine)
        finally:
            for p in batch:
                if not p.finished:  # only a BaseException (a thread torn down) leaves one
                    p.error = _not_written()
                    self._done(p, mine)

    def _write(self, batch: list[_Pending], mine: _Pending) -> None:
        try:
            with self._uow() as tx:
                values = {id(p): p.write(tx) for p in sorted(batch, key=_key)}
        except ServiceUnavailable as exc:
            # An outage fails every write at once (each retry would wait out its own connect
            # timeout, and a connection lost during COMMIT may have committed the batch); but
            # PostgreSQL's deadlock and serialization failures (SQLSTATE 40...) come the same
            # way and roll the batch back: then the first write is tried alone, and if it
            # meets an outage too, so do all.
            if len(batch) > 1 and _rolled_back(exc):
                self._alone(batch[0], mine)
                if not isinstance(batch[0].error, ServiceUnavailable):
                    for p in batch[1:]:
                        self._alone(p, mine)
                    return
            for p in batch:
                if not p.finished:
                    p.error = exc
                    self._done(p, mine)
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                self._done(batch[0], mine)
                return
            for p in batch:  # each on its own: the error is the failing write's alone
                self._alone(p, mine)
            return
        for p in batch:
            p.value = values[id(p)]
            self._done(p, mine)

    def _done(self, p: _Pending, mine: _Pending) -> None:
        # Under the lock, as every release is: a caller that gives up waiting (_abandon)
        # then tells a finished write from one handed the writer role.
        with self._lock:
            p.finished = True
            if p is not mine:
                p.wake.release()

    def _alone(self, p: _Pending, mine: _Pending) -> None:
        """One write in a transaction of its own; its caller woken as soon as it is done."""
        self.batches += 1
        try:
            with self._uow() as tx:
                p.value = p.write(tx)
        except Exception as exc:
            p.error = exc
        self._done(p, mine)


def _rolled_back(exc: BaseException) -> bool:
    """Whether the database said it rolled the transaction back (a deadlock, a
    serialization failure), as opposed to a connection that failed."""
    cause: BaseException | None = exc.__cause__
    while cause is not None:
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str):
            return state.startswith("40")
        cause = getattr(cause, "orig", None) or cause.__cause__
    return False


def _key(p: _Pending) -> str:
    return p.key


def _not_written() -> RuntimeError:
    return RuntimeError("the write was not committed")
