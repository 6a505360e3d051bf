"""PostgreSQL: the service waits a bounded time for each answer on an open connection
(``ANSWER_TIMEOUT_S``). A late answer is an outage (503 ``unavailable``) and its connection is
closed, never handed out again; migrations are not bounded. A server that does not answer at
all (SIGSTOPped) is tests/reliability/test_database_freeze.py; here a slow statement stands
in for it, on the suite's own test database."""

from __future__ import annotations

import time

import pytest

from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.storage import database
from toolkiln.storage.database import Database


def test_a_late_answer_is_an_outage_and_its_connection_is_dropped(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "ANSWER_TIMEOUT_S", 0.5)
    db = Database(postgres_url, pool_size=1)
    try:
        with db.transaction(readonly=True) as tx:
            slow_pid = tx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            with db.transaction(readonly=True) as tx:
                tx.connection.exec_driver_sql("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 4
        with db.transaction(readonly=True) as tx:  # works, on a connection of its own
            assert tx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar() != slow_pid
        assert db.problem() is None

        with database._unbounded(), db.engine.connect() as conn:  # as migrations run
            conn.exec_driver_sql("SELECT pg_sleep(1)")
    finally:
        db.dispose()
