"""Group commit (services/group_commit.py): writes of concurrent calls share a transaction,
and still each is committed before its caller returns, each error is its write's alone, and
nothing of a failed write stays. On the real database, both backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Space, free_port
from toolkiln.app import Runtime
from toolkiln.domain.errors import Conflict, ServiceUnavailable
from toolkiln.domain.execution import Code, RunOutcome
from toolkiln.domain.ids import new_id
from toolkiln.domain.origin import Budget, Caller, Origin
from toolkiln.domain.records import AuditFilter, AuditRow
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.group_commit import GroupCommit
from toolkiln.services.ports import UnitOfWork
from toolkiln.services.runs import Runs
from toolkiln.storage.database import Database


def _rows(runtime: Runtime, workspace_id: str, event: str) -> list[AuditRow]:
    with runtime.database.transaction(readonly=True) as tx:
        return tx.audit.page(AuditFilter(workspace_id=workspace_id, event=event), 0, 1000)


def _row(space: Space, event: str, n: int) -> AuditRow:
    return AuditRow(workspace_id=space.id, event=event, data={"n": n})


def _held(group: GroupCommit, space: Space) -> tuple[threading.Event, threading.Event, Any]:
    """A first write that holds its batch open until released, so others queue behind it."""
    entered, release = threading.Event(), threading.Event()

    def slow(tx: UnitOfWork) -> str:
        entered.set()
        assert release.wait(10)
        tx.audit.add(_row(space, "gc.first", 0))
        return "first"

    return entered, release, slow


def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _queue_behind(
    group: GroupCommit, space: Space, writes: list[Callable[[UnitOfWork], Any]]
) -> list[Any]:
    entered, release, slow = _held(group, space)
    with ThreadPoolExecutor(len(writes) + 1) as pool:
        first = pool.submit(group.run, slow)
        assert entered.wait(10)
        futures = [pool.submit(group.run, w) for w in writes]
        _until(lambda: group.waiting() == len(writes), "the writes queue")
        release.set()
        assert first.result(timeout=30) == "first"
        out: list[Any] = []
        for f in futures:
            try:
                out.append(f.result(timeout=30))
            except Exception as exc:  # the write's own error, as its caller sees it
                out.append(exc)
        return out


def test_writes_queued_behind_a_batch_are_committed_together(
    runtime: Runtime, space: Space
) -> None:
    group = GroupCommit(runtime.database.transaction)

    def write(n: int) -> Callable[[UnitOfWork], int]:
        def w(tx: UnitOfWork) -> int:
            tx.audit.add(_row(space, "gc.queued", n))
            return n

        return w

    got = _queue_behind(group, space, [write(n) for n in range(12)])
    assert got == list(range(12))  # each caller gets its own write's value
    assert sorted(r.data["n"] for r in _rows(runtime, space.id, "gc.queued")) == list(range(12))
    # 13 writes in fewer transactions than writes: the 12 queued ones shared a batch.
    assert group.writes == 13 and group.batches < 13


def test_a_failing_write_fails_alone_and_leaves_nothing(runtime: Runtime, space: Space) -> None:
    group = GroupCommit(runtime.database.transaction)

    def good(n: int) -> Callable[[UnitOfWork], int]:
        def w(tx: UnitOfWork) -> int:
            tx.audit.add(_row(space, "gc.good", n))
            return n

        return w

    def bad(tx: UnitOfWork) -> None:
        tx.audit.add(_row(space, "gc.bad", -1))  # written, then the write fails
        raise Conflict("no", code="conflict")

    got = _queue_behind(group, space, [good(1), bad, good(2), good(3)])
    assert got[0] == 1 and got[2:] == [2, 3]
    assert isinstance(got[1], Conflict)
    assert sorted(r.data["n"] for r in _rows(runtime, space.id, "gc.good")) == [1, 2, 3]
    assert _rows(runtime, space.id, "gc.bad") == []  # the failed write's row did not stay


def test_a_caller_returns_only_once_its_write_is_committed(runtime: Runtime, space: Space) -> None:
    """Right after run() returns, another connection sees the write, for every caller."""
    group = GroupCommit(runtime.database.transaction)
    seen: list[bool] = []

    def call(n: int) -> None:
        group.run(lambda tx: tx.audit.add(_row(space, "gc.durable", n)))
        rows = _rows(runtime, space.id, "gc.durable")
        seen.append(any(r.data["n"] == n for r in rows))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(64)))
    assert seen == [True] * 64


def test_a_lone_write_is_a_transaction_of_its_own(runtime: Runtime) -> None:
    group = GroupCommit(runtime.database.transaction)

    def fails(tx: UnitOfWork) -> None:
        raise Conflict("x", code="conflict")

    with pytest.raises(Conflict):
        group.run(fails)
    assert group.run(lambda tx: 7) == 7
    assert (group.batches, group.writes) == (2, 2)


def test_many_callers_each_get_their_own_outcome(runtime: Runtime, space: Space) -> None:
    """32 threads, 20 writes each, every 7th failing: each caller gets its own value or its
    own error, and exactly the writes that succeeded are stored (batches handed over from
    writer to writer, none lost, none waiting forever)."""
    group = GroupCommit(runtime.database.transaction)

    def write(n: int) -> Callable[[UnitOfWork], int]:
        def w(tx: UnitOfWork) -> int:
            tx.audit.add(_row(space, "gc.many", n))
            if n % 7 == 0:
                raise Conflict("seventh", code="conflict")
            return n

        return w

    def caller(t: int) -> list[object]:
        out: list[object] = []
        for i in range(20):
            n = t * 20 + i
            try:
                out.append(group.run(write(n)))
            except Conflict:
                out.append(("failed", n))
        return out

    with ThreadPoolExecutor(32) as pool:
        got = [x for chunk in pool.map(caller, range(32)) for x in chunk]
    want = [("failed", n) if n % 7 == 0 else n for n in range(640)]
    assert got == want
    stored = sorted(r.data["n"] for r in _rows(runtime, space.id, "gc.many"))
    assert stored == [n for n in range(640) if n % 7 != 0]
    assert group.waiting() == 0


def test_a_batch_is_written_in_key_order(runtime: Runtime, space: Space) -> None:
    """Rows are locked in one order (the tools' ids) by every batch, so two batches of two
    replicas on one PostgreSQL cannot deadlock each other; each caller still gets its own."""
    group = GroupCommit(runtime.database.transaction)
    order: list[str] = []
    entered, release, slow = _held(group, space)

    def keyed(key: str) -> Callable[[UnitOfWork], str]:
        def w(tx: UnitOfWork) -> str:
            order.append(key)
            return key

        return w

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(group.run, slow)
        assert entered.wait(10)
        later = [pool.submit(group.run, keyed(k), k) for k in ("tool-z", "tool-a", "tool-m")]
        _until(lambda: group.waiting() == 3, "the writes queue")
        release.set()
        assert first.result(timeout=30) == "first"
        assert [f.result(timeout=30) for f in later] == ["tool-z", "tool-a", "tool-m"]
    assert order == ["tool-a", "tool-m", "tool-z"]


def test_failures_recorded_in_one_batch_disable_the_tool_once(
    runtime: Runtime, space: Space
) -> None:
    """Four failed runs of one tool recorded in one batch: the counts move in order inside
    the transaction, the third disables the tool, exactly one tool.disabled row is written,
    and the fourth adds usage only (CONTRACT 4)."""
    who = runtime.services.access.authenticate(space.tokens["invoke,read,write"])
    draft = ToolDraft.of(name="batched", language="python", code="def main(**p):\n    return {}\n")
    tool = runtime.services.tools.create(who, space.id, draft)
    runs = Runs(runtime.database.transaction, {})
    code = Code("python", tool.definition.code, "main", 5000)

    def failed() -> Callable[[], None]:
        origin = Origin.root(Caller(who, space.id), new_id(), Budget.lasting(5000))
        run = origin.entering(tool.id)
        outcome = RunOutcome("exception", error_type="ValueError", message="no")
        result = Runs.shape(run, code, tool.version, outcome)
        return lambda: runs.record_tool(run, tool.id, result)

    entered, release, slow = _held(runs.writes, space)
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(runs.writes.run, slow)
        assert entered.wait(10)
        records = [pool.submit(f) for f in [failed() for _ in range(4)]]
        _until(lambda: runs.writes.waiting() == 4, "the records queue")
        release.set()
        first.result(timeout=30)
        for f in records:
            f.result(timeout=30)
    assert runs.writes.batches == 2  # the held write, then the four records together
    after = runtime.services.tools.get(who, tool.id)
    assert (after.status, after.failure_count, after.usage_count) == ("disabled", 3, 4)
    page = runtime.services.audit.page(
        who, AuditFilter(tool_id=tool.id, event="tool.disabled"), None, 10
    )
    assert len(page.items) == 1


def test_an_outage_fails_every_write_at_once() -> None:
    """A database that refuses connections: the writes queued in one batch all get
    ``unavailable`` after two tries in all (the writer's own, the batch), never one per
    write (a connection failure is not retried write by write: a commit may have gone
    through); and the next write is tried afresh."""
    down = Database(f"postgresql+psycopg://root@127.0.0.1:{free_port()}/nothing-listens-here")
    tries = 0

    def counted(readonly: bool = False) -> Any:
        nonlocal tries
        tries += 1
        return down.transaction(readonly)

    group = GroupCommit(counted)
    entered, release = threading.Event(), threading.Event()

    def held(tx: UnitOfWork) -> None:  # never reached: the transaction cannot begin
        return None

    real = down.transaction

    def slow_first(readonly: bool = False) -> Any:
        # The first transaction waits until the others have queued behind it.
        if not entered.is_set():
            entered.set()
            assert release.wait(10)
        return real(readonly)

    down.transaction = slow_first  # type: ignore[method-assign]
    try:
        with ThreadPoolExecutor(16) as pool:
            first = pool.submit(group.run, held)
            assert entered.wait(10)
            others = [pool.submit(group.run, held) for _ in range(15)]
            _until(lambda: group.waiting() == 15, "the writes queue")
            release.set()
            errors = [f.exception(timeout=60) for f in [first, *others]]
        assert all(isinstance(e, ServiceUnavailable) for e in errors), errors
        assert tries == 2, tries
        assert group.waiting() == 0
        with pytest.raises(ServiceUnavailable):
            group.run(held)
        assert tries == 3
    finally:
        down.dispose()


def test_a_deadlock_is_told_from_an_outage(runtime: Runtime, space: Space) -> None:
    """PostgreSQL reports a deadlock through the same 503 path as an outage; group commit
    retries write by write only for what the database rolled back (SQLSTATE 40...): a real
    deadlock between two transactions here."""
    from toolkiln.services.group_commit import _rolled_back

    if runtime.database.is_sqlite:
        pytest.skip("SQLite has one writer: no deadlock between two transactions to provoke")
    db = runtime.database
    with db.transaction() as tx:
        tx.audit.add(_row(space, "gc.deadlock", 1))
        tx.audit.add(_row(space, "gc.deadlock", 2))
    ids = [r.seq for r in _rows(runtime, space.id, "gc.deadlock")]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def cross(first: int, second: int) -> None:
        try:
            with db.engine.begin() as conn:
                update = "UPDATE audit SET event = event WHERE id = :id"
                conn.execute(sa.text(update), {"id": first})
                barrier.wait(10)
                conn.execute(sa.text(update), {"id": second})
        except Exception as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=cross, args=(ids[0], ids[1])),
        threading.Thread(target=cross, args=(ids[1], ids[0])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(errors) == 1, errors
    wrapped = ServiceUnavailable("x", code="unavailable")
    wrapped.__cause__ = errors[0]
    assert _rolled_back(wrapped)
    refused = Database(f"postgresql+psycopg://root@127.0.0.1:{free_port()}/nothing-listens-here")
    try:
        with pytest.raises(ServiceUnavailable) as caught:
            with refused.transaction():
                pass
        assert not _rolled_back(caught.value)
    finally:
        refused.dispose()
