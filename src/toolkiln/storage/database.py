"""Engine set-up for SQLite (WAL) and PostgreSQL, migrations, and the unit of work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

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
            # IMMEDIATE takes the write lock up front, so concurrent writers queue on
            # busy_timeout instead of failing with "database is locked" on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self) -> Iterator[SqlUnitOfWork]:
        with self.engine.begin() as conn:
            yield SqlUnitOfWork(conn)

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
