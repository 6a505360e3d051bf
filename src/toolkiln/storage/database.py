"""Engine set-up for SQLite (WAL) and PostgreSQL, migrations, and the unit of work."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from toolkiln.domain.errors import Conflict
from toolkiln.storage.repos import SqlUnitOfWork

MIGRATIONS = Path(__file__).parent / "migrations"


class Database:
    """One engine per process; each ``transaction()`` is one committed-or-rolled-back unit."""

    def __init__(self, url: str, *, pool_size: int = 16) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            kwargs["pool_size"] = pool_size
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
        self.engine = sa.create_engine(url, **kwargs)
        # SQLite has one writer at a time; when threads of this process queue for it inside
        # SQLite, its busy handler sleeps with backoff (up to 100 ms a try). Queueing on a
        # lock of ours instead hands the write lock over at once. Other processes (the CLI,
        # another replica on the same file) still meet busy_timeout.
        self._writer = threading.Lock() if self.is_sqlite else contextlib.nullcontext()
        if self.is_sqlite:
            self._tune_sqlite()

    def _tune_sqlite(self) -> None:
        @sa.event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, decide when transactions start.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @sa.event.listens_for(self.engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the lock up front (IMMEDIATE), so concurrent writers queue on
            # busy_timeout instead of failing with "database is locked" on upgrade;
            # readers use a plain BEGIN and never wait for writers (WAL).
            readonly = conn.info.get("toolkiln_readonly", False)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self, readonly: bool = False) -> Iterator[SqlUnitOfWork]:
        """One unit of work. A unique-constraint race that slipped past the services'
        checks becomes a Conflict, never a 500."""
        try:
            with contextlib.nullcontext() if readonly else self._writer:
                with self.engine.connect() as conn:
                    conn.info["toolkiln_readonly"] = readonly
                    with conn.begin():
                        yield SqlUnitOfWork(conn)
        except sa.exc.IntegrityError as exc:
            raise Conflict("The change conflicts with existing data.", code="conflict") from exc

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False

    def migrate(self) -> None:
        """Bring the schema to the newest migration (idempotent)."""
        with self.engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def dispose(self) -> None:
        self.engine.dispose()
