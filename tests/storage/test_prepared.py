"""The statements every invocation runs on the driver's cursor (storage/prepared.py), on both
backends: they read and write exactly what SQLAlchemy's own execution does, and their errors
reach ``Database.transaction`` as SQLAlchemy's (a conflict, a lost connection)."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import PG_URL
from toolkiln.app import Runtime
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict, ServiceUnavailable
from toolkiln.domain.ids import new_id
from toolkiln.domain.records import AuditRow, CallRecord, Policy
from toolkiln.domain.tools import ToolDraft
from toolkiln.storage import database, repos
from toolkiln.storage.database import Database
from toolkiln.storage.tables import audit, tokens, tool_calls, tools, workspaces


def _tool(runtime: Runtime, ws: str) -> str:
    writer = Principal("test-writer", ws, frozenset({"read", "write"}))
    draft = ToolDraft.of(
        name=f"prep-{secrets.token_hex(4)}",
        language="python",
        code="def main(**params):\n    return {'message': 'ok'}\n",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        enable_globally=True,
    )
    return runtime.services.tools.create(writer, ws, draft).id


@pytest.fixture
def ws(runtime: Runtime) -> str:
    return runtime.services.access.create_workspace(None, f"p-{secrets.token_hex(6)}").id


def test_reads_give_what_sqlalchemy_gives(runtime: Runtime, ws: str) -> None:
    """The tool and the token rows, every column (JSON, booleans, times), as SQLAlchemy's
    own execution returns them."""
    tool_id = _tool(runtime, ws)
    issued = runtime.services.access.create_token(None, ws, "invoke")
    db = runtime.database
    with db.engine.connect() as conn:
        want_tool = dict(conn.execute(tools.select().where(tools.c.id == tool_id)).mappings().one())
        hashed = issued.record.token_hash
        want_token = dict(
            conn.execute(tokens.select().where(tokens.c.token_hash == hashed)).mappings().one()
        )
        got_tool = repos._TOOL_BY_ID.first(conn, {"id": tool_id})
        got_token = repos._TOKEN_BY_HASH.first(conn, {"h": hashed})
        assert repos._TOOL_BY_ID.first(conn, {"id": "no-such-tool"}) is None
    assert got_tool == want_tool
    assert got_token == want_token
    assert isinstance(got_tool["created_at"], datetime)
    assert got_tool["enable_globally"] is True
    assert got_tool["input_schema"]["properties"]["q"] == {"type": "string"}


def test_the_policy_read_gives_what_sqlalchemy_gives(runtime: Runtime, ws: str) -> None:
    """A run's first ctx call reads its workspace's policy: the stored JSON as SQLAlchemy reads
    it, and the default policy for a workspace that has none."""
    admin = Principal("test-admin", None, frozenset({"admin"}))
    change = {"builtins": ["calculate"], "email_allowlist": ["example.org"]}
    runtime.services.access.patch_policy(admin, ws, change)
    with runtime.database.engine.connect() as conn:
        q = sa.select(workspaces.c.policy).where(workspaces.c.id == ws)
        want = conn.execute(q).scalar()
        got = repos._POLICY.first(conn, {"id": ws})
        policy = repos.SqlWorkspaces(conn).policy(ws)
        default = repos.SqlWorkspaces(conn).policy("no-such-workspace")
    assert got == {"policy": want}
    assert policy == Policy.from_dict(want)
    assert policy.builtins == ["calculate"] and policy.email_allowlist == ["example.org"]
    assert default == Policy()


def test_the_invocations_one_read_gives_what_the_separate_reads_give(
    runtime: Runtime, ws: str
) -> None:
    """``ToolRepo.get_as``: the token, the tool and its workspace's policy in one statement,
    each exactly as its own read gives it; no tool is (token, None, None), no token None. A
    tool of another workspace comes back too: whether the token may reach it is the
    service's to decide (and it answers 404: tests/security/test_workspace_scope.py)."""
    admin = Principal("test-admin", None, frozenset({"admin"}))
    runtime.services.access.patch_policy(admin, ws, {"builtins": ["calculate"]})
    tool_id = _tool(runtime, ws)
    other = runtime.services.access.create_workspace(None, f"p-{secrets.token_hex(6)}").id
    foreign = _tool(runtime, other)
    hashed = runtime.services.access.create_token(None, ws, "invoke").record.token_hash
    with runtime.database.transaction(readonly=True) as tx:
        got = tx.tools.get_as(hashed, tool_id)
        want = (tx.tokens.by_hash(hashed), tx.tools.get(tool_id), tx.workspaces.policy(ws))
        missing = tx.tools.get_as(hashed, "no-such-tool")
        unknown = tx.tools.get_as("no-such-hash", tool_id)
        across = tx.tools.get_as(hashed, foreign)
        want_across = tx.tools.get(foreign), tx.workspaces.policy(other)
    assert got == want
    assert got is not None and got[2] is not None and got[2].builtins == ["calculate"]
    assert missing == (want[0], None, None)
    assert unknown is None
    assert across is not None and (across[1], across[2]) == want_across


def test_writes_store_what_sqlalchemy_reads_back(runtime: Runtime, ws: str) -> None:
    """A call record and audit rows written by the prepared inserts, the counters by the
    prepared update, read back through SQLAlchemy: the same values, JSON and times included."""
    tool_id = _tool(runtime, ws)
    call_id = new_id()
    when = datetime(2026, 12, 1, 12, 30, 5, 123456, tzinfo=UTC)
    result = {"status": "ok", "raw_data": {"é": [1, 2.5, None, True]}, "message": "ü\u2028"}
    rows = [
        AuditRow(
            workspace_id=ws,
            event=f"custom.e{i}",
            data={"i": i, "text": "ctx"},
            tool_id=tool_id,
            tool_call_id=call_id,
            source="api",
            created_at=when,
        )
        for i in range(3)
    ]
    with runtime.database.transaction() as tx:
        counted = tx.tools.count_outcome(tool_id, True, "boom")
        tx.calls.add(
            CallRecord(
                call_id, ws, tool_id, 1, "invoke", "error", "runtime_error", result, None, when
            )
        )
        tx.audit.add_many(rows)
        tx.audit.add(rows[0])
    assert (counted.found, counted.failure_count, counted.status) == (True, 1, "active")
    with runtime.database.engine.connect() as conn:
        stored = (
            conn.execute(tool_calls.select().where(tool_calls.c.id == call_id)).mappings().one()
        )
        events = conn.execute(
            sa.select(audit.c.event, audit.c.data, audit.c.created_at)
            .where(audit.c.tool_call_id == call_id)
            .order_by(audit.c.id)
        ).all()
        counters = conn.execute(
            sa.select(tools.c.usage_count, tools.c.failure_count, tools.c.last_error).where(
                tools.c.id == tool_id
            )
        ).one()
    assert stored["result"] == result
    assert (stored["status"], stored["error_code"], stored["version"]) == (
        "error",
        "runtime_error",
        1,
    )
    assert stored["created_at"].replace(tzinfo=UTC) == when
    assert [e[0] for e in events] == ["custom.e0", "custom.e1", "custom.e2", "custom.e0"]
    assert events[1][1] == {"i": 1, "text": "ctx"}
    assert tuple(counters) == (1, 1, "boom")
    with runtime.database.transaction() as tx:
        assert tx.calls.exists(ws, call_id)
        assert not tx.calls.exists(ws, new_id())
        assert tx.tools.status(tool_id) == "active"
        assert tx.tools.status("no-such-tool") is None


def test_a_duplicate_call_is_a_conflict_and_nothing_of_it_stays(runtime: Runtime, ws: str) -> None:
    tool_id = _tool(runtime, ws)
    call_id = new_id()
    record = CallRecord(call_id, ws, tool_id, 1, "invoke", "ok", None, {}, None, datetime.now(UTC))
    with runtime.database.transaction() as tx:
        tx.calls.add(record)
    with pytest.raises(Conflict):
        with runtime.database.transaction() as tx:
            tx.tools.count_outcome(tool_id, False, None)
            tx.calls.add(record)
    with runtime.database.engine.connect() as conn:
        usage = conn.execute(sa.select(tools.c.usage_count).where(tools.c.id == tool_id)).scalar()
    assert usage == 0  # the counter update of the failed transaction was rolled back


def test_a_connection_lost_mid_statement_is_an_outage_and_the_pool_heals(
    runtime: Runtime, ws: str, backend: str
) -> None:
    """PostgreSQL ends the transaction's connection (as a restart would): the prepared
    statement's error is an outage (503 ``unavailable``), the dead connection is not put
    back in the pool, and the next transaction works."""
    if backend != "postgresql":
        pytest.skip("a SQLite connection is a file handle: there is no server to lose")
    tool_id = _tool(runtime, ws)
    admin_url = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    with pytest.raises(ServiceUnavailable):
        with runtime.database.transaction() as tx:
            conn = tx.connection
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with psycopg.connect(admin_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            tx.tools.count_outcome(tool_id, False, None)
    # Every pooled connection works: held all at once, since the pool hands out the one used
    # last first (LIFO), and one after the other would be the same connection each time.
    with contextlib.ExitStack() as held:
        for _ in range(runtime.database.engine.pool.size() + 1):
            tx = held.enter_context(runtime.database.transaction(readonly=True))
            assert tx.tools.status(tool_id) == "active"


def test_a_connection_dropped_while_idle_is_replaced_before_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL: a pooled connection idle for ``PING_IDLE_S`` is pinged at checkout, and
    one the server dropped meanwhile (as a restart does) is replaced: the transaction works,
    no error reaches the caller. One used a moment ago is not pinged (two round trips of
    every invocation, docs/decisions/110-connection-pool.md): if the server dropped it in that
    moment, the statement is an outage (503) and the next transaction connects anew."""
    url = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    db = Database(PG_URL, pool_size=1)

    def backend() -> int:
        with db.transaction(readonly=True) as tx:
            return int(tx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar())

    def drop(pid: int) -> None:
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    try:
        monkeypatch.setattr(database, "PING_IDLE_S", 0.0)  # every checkout is "idle"
        first = backend()
        drop(first)
        second = backend()  # pinged, found dead, replaced: no error
        assert second != first
        monkeypatch.setattr(database, "PING_IDLE_S", 3600.0)  # none is
        drop(second)
        with pytest.raises(ServiceUnavailable):
            backend()
        assert backend() not in (first, second)  # and the pool healed
    finally:
        db.dispose()


@pytest.mark.parametrize("one_statement", [False, True], ids=["transaction", "one-statement"])
def test_a_unit_whose_connection_is_lost_answers_without_connecting_again(
    one_statement: bool,
) -> None:
    """PostgreSQL ends a unit's connection while it runs: the unit is an outage (503) at
    once, without a new connection made on the way out (cleaning up after the unit once
    asked the lost connection for its ``info``, which connects anew: in a real outage a
    connect attempt, up to CONNECT_TIMEOUT_S, before the 503)."""
    url = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    db = Database(PG_URL, pool_size=1)
    connects = 0

    def counted(*_args: object) -> None:
        nonlocal connects
        connects += 1

    sa.event.listen(db.engine, "connect", counted)
    try:
        with db.transaction(readonly=True) as tx:
            tx.connection.exec_driver_sql("SELECT 1")
        assert connects == 1
        with pytest.raises(ServiceUnavailable):
            with db.transaction(readonly=True, one_statement=one_statement) as tx:
                conn = tx.connection
                pid = int(conn.connection.dbapi_connection.info.backend_pid)
                with psycopg.connect(url, autocommit=True) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", (pid,))
                conn.exec_driver_sql("SELECT 1")
        assert connects == 1  # none made on the way out
        with db.transaction(readonly=True) as tx:  # the next unit connects anew
            assert tx.connection.exec_driver_sql("SELECT 1").scalar() == 1
        assert connects == 2
    finally:
        db.dispose()


def test_a_write_lock_held_past_the_busy_timeout_is_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: every transaction begins on the driver's cursor; another process holding the
    write lock longer than the busy timeout makes that a 503 ``unavailable`` (not a 500), and
    the database works again once the lock is gone."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    db = Database(url, pool_size=1)
    try:
        db.migrate()
        other = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(ServiceUnavailable):
            with db.transaction() as tx:
                tx.tools.status("any")
        other.execute("ROLLBACK")
        other.close()
        with db.transaction() as tx:
            assert tx.tools.status("any") is None
    finally:
        db.dispose()


def test_a_one_statement_read_runs_without_a_transaction_on_postgresql(
    runtime: Runtime, ws: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``one_statement=True`` (the status re-read at admission,
    docs/decisions/108-one-read-per-call.md):
    PostgreSQL runs the read in autocommit, so no transaction is open while it runs (no
    BEGIN before it, so no COMMIT after it: one round trip instead of three), and it sees
    what was committed; the connection goes back to the pool transactional again, also when
    the unit raised and when it was pinged at checkout. SQLite, with no round trips to save,
    reads in a transaction as before."""
    tool_id = _tool(runtime, ws)
    db = runtime.database
    with db.transaction() as tx:
        tx.connection.execute(tools.update().where(tools.c.id == tool_id).values(status="disabled"))
    with db.transaction(readonly=True, one_statement=True) as tx:
        dbapi = tx.connection.connection.dbapi_connection
        assert tx.tools.status(tool_id) == "disabled"  # the statement Admissions.active runs
        if backend == "postgresql":
            assert dbapi.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        else:
            assert dbapi.in_transaction  # a plain read transaction
    if backend != "postgresql":
        return
    assert dbapi.autocommit is False  # reset when it went back to the pool
    with pytest.raises(LookupError):
        with db.transaction(readonly=True, one_statement=True) as tx:
            dbapi = tx.connection.connection.dbapi_connection
            assert dbapi.autocommit is True
            raise LookupError("the caller's own error")
    assert dbapi.autocommit is False  # reset on the way out of an error too
    with db.transaction(readonly=True) as tx:
        assert tx.tools.status(tool_id) == "disabled"
        again = tx.connection.connection.dbapi_connection
        assert again.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    # A connection pinged at its checkout (idle for PING_IDLE_S) reads so too.
    pings = 0
    real_ping = db.engine.dialect.do_ping

    def counted_ping(dbapi_conn: object) -> bool:
        nonlocal pings
        pings += 1
        return bool(real_ping(dbapi_conn))

    monkeypatch.setattr(db.engine.dialect, "do_ping", counted_ping)
    monkeypatch.setattr(database, "PING_IDLE_S", 0.0)
    with db.transaction(readonly=True, one_statement=True) as tx:
        assert pings == 1
        assert tx.tools.status(tool_id) == "disabled"
        pinged = tx.connection.connection.dbapi_connection
        assert pinged.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_one_statement_unit_refuses_a_second_statement(runtime: Runtime, ws: str) -> None:
    """A second statement in a one-statement unit raises, whichever way it is run (a
    prepared statement, SQLAlchemy's execution): on PostgreSQL it would be committed apart
    from the first. The next unit on that connection is not limited."""
    tool_id = _tool(runtime, ws)
    db = runtime.database
    with pytest.raises(RuntimeError, match="second statement"):
        with db.transaction(readonly=True, one_statement=True) as tx:
            assert tx.tools.status(tool_id) == "active"
            tx.tools.status(tool_id)
    with pytest.raises(RuntimeError, match="second statement"):
        with db.transaction(readonly=True, one_statement=True) as tx:
            tx.connection.execute(sa.select(tools.c.name).where(tools.c.id == tool_id))
            tx.tools.status(tool_id)
    with pytest.raises(RuntimeError, match="second statement"):
        with db.transaction(readonly=True, one_statement=True) as tx:
            tx.tools.status(tool_id)
            tx.connection.execute(sa.select(tools.c.name).where(tools.c.id == tool_id))
    with pytest.raises(ValueError, match="for a read"):
        with db.transaction(one_statement=True):
            pass
    with db.transaction(readonly=True) as tx:  # any number of statements again
        assert tx.tools.status(tool_id) == tx.tools.status(tool_id) == "active"
