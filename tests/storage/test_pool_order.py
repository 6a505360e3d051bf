"""The pool hands out the connection used last (storage/database.py): one after the other,
transactions run on one connection, whose SQLite page cache is then still valid, while the
others stay idle; on both backends."""

from __future__ import annotations

import contextlib

from toolkiln.app import Runtime
from toolkiln.storage.repos import SqlUnitOfWork


def _driver_connection(tx: SqlUnitOfWork) -> object:
    conn = tx.connection
    return conn.connection.dbapi_connection


def test_transactions_one_after_the_other_reuse_the_connection_used_last(
    runtime: Runtime,
) -> None:
    db = runtime.database
    with contextlib.ExitStack() as held:  # at least three connections made and idle
        made = [
            _driver_connection(held.enter_context(db.transaction(readonly=True))) for _ in range(3)
        ]
    assert len({id(c) for c in made}) == 3
    with db.transaction() as tx:
        first = _driver_connection(tx)
        tx.tools.status("none")
    seen = set()
    for readonly in (True, False, True, True, False):
        with db.transaction(readonly=readonly) as tx:
            seen.add(id(_driver_connection(tx)))
            tx.tools.status("none")
    assert seen == {id(first)}
