"""Group commit: the records of calls that end at the same time, written in one transaction.

Every call ends with one write (its counters, its stored Result, its audit rows). Under
concurrency those writes queue for the database's writer anyway (SQLite has one; on
PostgreSQL each commit waits for its WAL flush), so the caller that finds no batch being
written writes every write queued so far in one transaction, and wakes their callers when it
has committed. No caller returns before the transaction holding its write has committed: a
call is never acknowledged before its record is durable. Alone, a write is a transaction of
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
            mine.wake.acquire()  # its batch committed, or it writes the next one
            if mine.finished:
                return mine.outcome()
        try:
            while not mine.finished:
                with self._lock:
                    batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                try:
                    self._commit(batch)
                finally:
                    for p in batch:
                        if p is not mine:
                            p.wake.release()
        finally:
            with self._lock:
                if self._queue:
                    self._queue[0].wake.release()  # the first still queued writes next
                else:
                    self._writing = False
        return mine.outcome()

    def waiting(self) -> int:
        """Writes queued behind the batch being written."""
        with self._lock:
            return len(self._queue)

    def _commit(self, batch: list[_Pending]) -> None:
        self.batches += 1
        self.writes += len(batch)
        try:
            self._write(batch)
        finally:
            for p in batch:
                if not p.finished:  # only a BaseException (a thread torn down) leaves one
                    p.error, p.finished = _not_written(), True

    def _write(self, batch: list[_Pending]) -> None:
        try:
            with self._uow() as tx:
                values = {id(p): p.write(tx) for p in sorted(batch, key=_key)}
        except ServiceUnavailable as exc:
            for p in batch:
                p.error, p.finished = exc, True
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error, batch[0].finished = exc, True
                return
            for p in batch:  # each on its own: the error is the failing write's alone
                self._alone(p)
            return
        for p in batch:
            p.value, p.finished = values[id(p)], True

    def _alone(self, p: _Pending) -> None:
        self.batches += 1
        try:
            with self._uow() as tx:
                p.value = p.write(tx)
        except Exception as exc:
            p.error = exc
        p.finished = True


def _key(p: _Pending) -> str:
    return p.key


def _not_written() -> RuntimeError:
    return RuntimeError("the write was not committed")
