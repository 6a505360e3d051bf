"""The statements every invocation runs, on the driver's cursor.

``Connection.execute`` spends most of its time around the statement, not in the database:
the statement's cache key, an execution context, a result object, event dispatch. For the
few statements every call runs (the token and the tool it reads, the counters, the stored
call and its audit rows it writes) that was more than the database's own work
(docs/decisions/109-prepared-statements.md). A ``Prepared`` statement is compiled by SQLAlchemy once
per dialect, so its SQL, parameter order, literal values and type conversions are SQLAlchemy's own,
and then runs on the DBAPI cursor of the connection's transaction, which SQLAlchemy still
begins, commits and pools. The driver's errors are raised as SQLAlchemy's, the way
``Connection.execute`` raises them, so ``Database.transaction`` maps them as any other
(a conflict, an outage, a dropped connection: invalidated, as SQLAlchemy would).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

Processor = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the bind names, in the order of a positional paramstyle
    positional: bool
    fixed: dict[str, Any]  # binds with a value of their own (``usage_count + 1``)
    binds: tuple[tuple[str, Processor], ...]  # names whose values the type converts
    columns: tuple[str, ...]  # a statement returning rows: their keys, and converters
    results: tuple[Processor | None, ...]


class Prepared:
    """One statement, compiled once per dialect; ``keys`` name an INSERT's columns."""

    def __init__(self, statement: Any, keys: Sequence[str] | None = None) -> None:
        self._statement = statement
        self._keys = list(keys) if keys is not None else None
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()

    def _for(self, dialect: Dialect) -> _Compiled:
        key = (dialect.name, dialect.driver)
        found = self._compiled.get(key)
        if found is not None:
            return found
        compiled = self._statement.compile(dialect=dialect, column_keys=self._keys)
        binds = {name: bind for bind, name in compiled.bind_names.items()}  # as the SQL names them
        names = tuple(compiled.positiontup or ()) if dialect.positional else tuple(binds)
        fixed = {n: b.effective_value for n, b in binds.items() if not b.required}
        procs = []
        for name, bind in binds.items():
            proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if proc is not None:
                procs.append((name, proc))
        returned = list(self._statement.exported_columns)  # a SELECT's, or RETURNING's
        columns = tuple(c.key for c in returned)
        results = tuple(
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in returned
        )
        made = _Compiled(
            compiled.string, names, dialect.positional, fixed, tuple(procs), columns, results
        )
        with self._lock:
            self._compiled[key] = made
        return made

    # -- running it

    def first(self, conn: Connection, params: dict[str, Any]) -> dict[str, Any] | None:
        """The first row returned, by column key (converted by the columns' types)."""
        c = self._for(conn.dialect)
        row = self._run(conn, c, [params], many=False)
        if row is None:
            return None
        return {
            k: (p(v) if p is not None else v)
            for k, p, v in zip(c.columns, c.results, row, strict=True)
        }

    def run(self, conn: Connection, params: dict[str, Any]) -> None:
        self._run(conn, self._for(conn.dialect), [params], many=False)

    def run_many(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._run(conn, self._for(conn.dialect), rows, many=True)

    def _run(self, conn: Connection, c: _Compiled, rows: list[dict[str, Any]], many: bool) -> Any:
        args = [_arguments(c, r) for r in rows]
        return on_cursor(conn, c.sql, args if many else args[0], many=many, fetch=bool(c.columns))


# ``Connection.info`` key of a unit of work that may run one statement (``Database.
# transaction(one_statement=True)``): on PostgreSQL it runs in autocommit, where a second
# statement would be committed apart from the first.
ONE_STATEMENT = "toolkiln_one_statement"


def count_statement(conn: Connection, *_event: object) -> None:
    """Refuse a second statement in a one-statement unit (a programming error, not data's):
    the engine's ``before_cursor_execute`` listener (its other arguments unused)."""
    left = conn.info.get(ONE_STATEMENT)
    if left is None:
        return
    if left <= 0:
        raise RuntimeError("a one-statement unit of work ran a second statement")
    conn.info[ONE_STATEMENT] = left - 1


def on_cursor(
    conn: Connection,
    sql: str,
    args: Any = (),
    *,
    many: bool = False,
    fetch: bool = False,
    counted: bool = True,
) -> Any:
    """``sql`` on the driver's cursor of ``conn``'s transaction; the first row if ``fetch``.
    A driver error is raised as SQLAlchemy's (a lost connection invalidated first). As for
    SQLAlchemy's own statements, the engine's ``before_cursor_execute`` listeners are told
    first (``count_statement``, and whoever else listens: tests count a call's statements).
    ``counted=False``: not a statement of the unit's own (SQLite's BEGIN)."""
    dbapi = conn.connection.dbapi_connection  # the pooled connection of this transaction
    assert dbapi is not None
    dialect = conn.dialect
    cursor = dbapi.cursor()
    try:
        if counted:
            conn.dispatch.before_cursor_execute(conn, cursor, sql, args, None, many)
        if many:
            cursor.executemany(sql, args)
            return None
        cursor.execute(sql, args)
        return cursor.fetchone() if fetch else None
    except dialect.loaded_dbapi.Error as exc:
        lost = dialect.is_disconnect(exc, dbapi, cursor)
        if lost:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql,
            args,
            exc,
            dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=lost,
            dialect=dialect,
        ) from exc
    finally:
        try:
            cursor.close()
        except dialect.loaded_dbapi.Error:
            pass  # the connection is gone; the error above says so


def _arguments(c: _Compiled, params: dict[str, Any]) -> Any:
    values = {**c.fixed, **params} if c.fixed else dict(params)
    for name, proc in c.binds:
        values[name] = proc(values[name])
    if c.positional:
        return tuple(values[n] for n in c.names)
    return values
