"""Engine set-up for SQLite (WAL) and PostgreSQL, migrations, and the unit of work."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa

from toolkiln.domain.errors import Conflict, ServiceUnavailable
from toolkiln.storage.prepared import on_cursor
from toolkiln.storage.repos import SqlUnitOfWork

log = logging.getLogger("toolkiln.storage")
MIGRATIONS = Path(__file__).parent / "migrations"
# One advisory-lock key for "migrating this database", the same in every replica.
MIGRATION_LOCK = zlib.crc32(b"toolkiln.migrate")
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10
BUSY_TIMEOUT_S = 30  # SQLite: how long a statement waits for another connection's lock
UNREACHABLE = "The database is unreachable; try again shortly."
# SQLite: the WAL is copied back into the database by a background loop (``checkpoint``,
# every CHECKPOINT_EVERY_S), not by whichever commit crosses SQLite's default 1000 pages: that
# commit then did the copy and two fsyncs on a call's path (a 1-in-100 p99 spike). A commit
# still checkpoints itself past this many pages (~16 MB), when no loop runs (a short CLI
# command, another process on the same file) or it falls behind.
WAL_BACKSTOP_PAGES = 4000
CHECKPOINT_EVERY_S = 0.25
SQLITE_OUTAGES = (
    "unable to open",
    "database is locked",
    "disk i/o error",
    "readonly database",
    "database or disk is full",
)


def _wal(cur: sqlite3.Cursor) -> None:
    """Put the database in WAL mode. A new database's first connections race to convert it,
    and SQLite answers the losers "database is locked" at once, without waiting in its busy
    handler (replicas or CLI commands started together on a new data dir): so the
    conversion is retried for as long as the busy timeout would have waited."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def is_outage(exc: BaseException) -> bool:
    """Errors that say the database cannot be reached (or gave up on us), not that a
    statement was wrong: a refused or dropped connection, a pool with no connection to
    give, SQLite's file that cannot be opened or written or stays locked. (SQLite reports
    a bad statement as an OperationalError too, hence its messages.)"""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa.exc.TimeoutError):
        return True
    if not isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return False
    if isinstance(exc.orig, sqlite3.Error):
        return any(s in str(exc.orig).lower() for s in SQLITE_OUTAGES)
    return True


class Database:
    """One engine per process; each ``transaction()`` is one committed-or-rolled-back unit."""

    def __init__(self, url: str, *, pool_size: int = 16) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_S}
            kwargs["pool_size"] = pool_size
        else:
            # Pre-ping replaces connections a restarted server dropped, so the service
            # recovers by itself; the timeouts make an outage a fast 503, never a hang.
            kwargs.update(
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_pre_ping=True,
                pool_timeout=POOL_TIMEOUT_S,
            )
            if "connect_timeout" not in url:
                kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
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
            _wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
            cur.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
            cur.close()

        @sa.event.listens_for(self.engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the lock up front (IMMEDIATE), so concurrent writers queue on
            # busy_timeout instead of failing with "database is locked" on upgrade;
            # readers use a plain BEGIN and never wait for writers (WAL).
            # On the driver's cursor (storage/prepared.py): every transaction begins here.
            readonly = conn.info.get("toolkiln_readonly", False)
            on_cursor(conn, "BEGIN" if readonly else "BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self, readonly: bool = False) -> Iterator[SqlUnitOfWork]:
        """One unit of work. A unique-constraint race that slipped past the services'
        checks becomes a Conflict, never a 500; a database that cannot be reached becomes
        ServiceUnavailable (503 ``unavailable``), for every transport alike."""
        try:
            with contextlib.nullcontext() if readonly else self._writer:
                with self.engine.connect() as conn:
                    conn.info["toolkiln_readonly"] = readonly
                    with conn.begin():
                        yield SqlUnitOfWork(conn)
        except sa.exc.IntegrityError as exc:
            raise Conflict("The change conflicts with existing data.", code="conflict") from exc
        except sa.exc.SQLAlchemyError as exc:
            if not is_outage(exc):
                raise
            log.warning("database unreachable: %s", str(exc).splitlines()[0])
            raise ServiceUnavailable(UNREACHABLE, code="unavailable") from exc

    def checkpoint(self) -> tuple[int, int] | None:
        """Copy what the SQLite WAL holds back into the database, without waiting for
        readers or writers (PASSIVE): (frames in the WAL, frames copied). None on PostgreSQL."""
        if not self.is_sqlite:
            return None
        with self.engine.connect() as conn:
            # On the driver's connection: outside any transaction (ours would BEGIN IMMEDIATE).
            raw = conn.connection.driver_connection
            assert raw is not None
            row = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return (int(row[1]), int(row[2])) if row is not None else (0, 0)

    async def checkpointer(self, healthy: Callable[[], None]) -> None:
        """A background loop (``services.background``): checkpoint every CHECKPOINT_EVERY_S."""
        own = anyio.CapacityLimiter(1)  # not queued behind requests for the shared threads
        while True:
            await anyio.to_thread.run_sync(self.checkpoint, limiter=own)
            healthy()
            await anyio.sleep(CHECKPOINT_EVERY_S)

    def problem(self) -> str | None:
        """None when the database answers; else why not, in one line (for /healthz)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return None
        except sa.exc.SQLAlchemyError as exc:
            return _cause(exc)

    def migrate(self) -> str | None:
        """Bring the schema to the newest migration (idempotent); the revision it migrated
        to, or None when the schema was at head already.

        At head (every start but the first after an upgrade) Alembic is not even imported:
        one ``SELECT`` on ``alembic_version`` decides, so a CLI command stays quick and
        quiet.

        Replicas started together on a new database must not all create it: on PostgreSQL
        the upgrade runs under a transaction-scoped advisory lock, on SQLite under the
        write lock that ``BEGIN IMMEDIATE`` takes. Whoever waits finds the schema at head.
        """
        try:
            return self._migrate()
        except sa.exc.SQLAlchemyError as exc:
            if not is_outage(exc):
                raise
            where = sa.make_url(self.url).render_as_string(hide_password=True)
            raise ServiceUnavailable(
                f"The database {where} is unreachable: {_cause(exc)}", code="unavailable"
            ) from exc

    def _migrate(self) -> str | None:
        with self.engine.begin() as conn:
            if not self.is_sqlite:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            # Under the lock, so that whoever waited sees what the migrator did.
            if _at_head(conn):
                return None
            with _ALEMBIC_IMPORT:  # Alembic's modules are not safe to import from two threads
                from alembic import command
                from alembic.config import Config
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        return head_revision()

    def dispose(self) -> None:
        self.engine.dispose()


_ALEMBIC_IMPORT = threading.Lock()


def _at_head(conn: sa.Connection) -> bool:
    if not sa.inspect(conn).has_table("alembic_version"):
        return False
    found = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
    return list(found) == [head_revision()]


@functools.cache
def head_revision() -> str:
    """The newest revision of ``migrations/versions``: the one no other names as its
    ``down_revision`` (read from the files, without loading Alembic)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("[0-9]*.py"):
        text = path.read_text()
        found = re.search(r"^revision(?:\s*:[^=\n]*)?\s*=\s*[\"']([^\"']+)", text, re.M)
        down = re.search(r"^down_revision(?:\s*:[^=\n]*)?\s*=\s*[\"']([^\"']+)", text, re.M)
        if found:
            revisions.add(found.group(1))
        if down:
            parents.add(down.group(1))
    heads = sorted(revisions - parents)
    if len(heads) != 1:  # Alembic itself reports a branched history
        return ",".join(heads)
    return heads[0]


def _cause(exc: sa.exc.SQLAlchemyError) -> str:
    """The driver's own words, in one line."""
    cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig else exc
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}"[:300]
