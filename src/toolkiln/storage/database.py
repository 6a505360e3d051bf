"""Engine set-up for SQLite (WAL) and PostgreSQL, migrations, and the unit of work."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
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
import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from toolkiln.domain.errors import Conflict, ServiceUnavailable
from toolkiln.storage import tables
from toolkiln.storage.prepared import ONE_STATEMENT, count_statement, on_cursor
from toolkiln.storage.repos import SqlUnitOfWork

log = logging.getLogger("toolkiln.storage")
MIGRATIONS = Path(__file__).parent / "migrations"
# One advisory-lock key for "migrating this database", the same in every replica.
MIGRATION_LOCK = zlib.crc32(b"toolkiln.migrate")
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10
# A PostgreSQL connection idle this long is pinged before use (_ping_idle).
PING_IDLE_S = 1.0
# PostgreSQL: how long the service waits for the server's answer to one round trip on an
# open connection (a statement, a commit, the ping of an idle pooled one). A server that stops
# answering but keeps its connections open (a hung host, a frozen process, a partition)
# would otherwise hold the request, and its thread, for ever: nothing on the server side
# (statement_timeout) can end a wait when the server itself does not run. A connection
# whose answer is late is closed, so the pool never hands it out again.
ANSWER_TIMEOUT_S = 5.0
# TCP keepalives and an unacknowledged-data bound, so that a connection to a host that is
# gone (a partition) fails on its own, idle in the pool or listening, in ~10-20 s, not
# after the kernel's ~15 minutes of retransmissions.
KEEPALIVE_ARGS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # ms
}
BUSY_TIMEOUT_S = 30  # SQLite: how long a statement waits for another connection's lock
UNREACHABLE = "The database is unreachable; try again shortly."
DISK_FULL = "The database's disk is full: nothing can be written until space is freed."
# SQLite: /healthz reports the database's disk full below this much free space (a commit
# needs a few pages for the WAL; with less, every write fails while reads still work).
MIN_FREE_BYTES = 1 << 20
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


# Set while migrating (Database.migrate): that work has no ANSWER_TIMEOUT_S.
_unbounded_now = contextvars.ContextVar("toolkiln_unbounded", default=False)


def _ping_idle(engine: sa.Engine) -> None:
    """Ping a PostgreSQL connection at checkout only when it sat idle for ``PING_IDLE_S``
    since its checkin (SQLAlchemy's documented checkout-event recipe, with the dialect's own
    ping). A failed ping raises ``InvalidatePoolError``, as ``pool_pre_ping`` does: the pool
    then replaces that connection (one more try) and every connection made before it, the
    recently used ones included. ``pool_pre_ping`` pinged at every checkout: two round trips
    of each invocation's ten, ~0.09 ms each on loopback and more over a network
    (docs/decisions/110-connection-pool.md). A connection taken again less than ``PING_IDLE_S``
    after its checkin is used unpinged; if the server dropped it in that moment (a restart), the
    statement fails as an outage (503 with Retry-After) and that connection is replaced:
    under load, each pooled connection taken again that fast can cost one such 503 until a
    ping finds the restart (tests/storage/test_prepared.py; the service recovers by itself:
    tests/reliability/test_database_outage.py)."""

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(_dbapi: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < PING_IDLE_S:
            return  # new (it just connected), or in use a moment ago
        try:
            engine.dialect.do_ping(dbapi)  # the dialect's own ping, as pool_pre_ping's
        except Exception as exc:  # any failure: a new connection is the safe answer
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise sa.exc.InvalidatePoolError(why) from exc


class _BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded (ANSWER_TIMEOUT_S).

    Every exchange on an open connection (execute, commit, rollback, the idle ping) goes
    through ``wait``; psycopg's own wait takes a timeout and raises ``_WaitTimeout`` when
    it expires (psycopg is pinned: pyproject.toml). A wait psycopg bounds itself (LISTEN's
    ``notifies``, a cancellation) keeps its own timeout. On expiry the connection is in
    the middle of an exchange, so it is closed: SQLAlchemy then sees a disconnect
    (``closed``) and invalidates it (a statement of SQLAlchemy's own, the pool's other
    connections too; the invoke's prepared statements, storage/prepared.py, that one), and
    the caller's error becomes an outage (is_outage, 503 ``unavailable``)."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or _unbounded_now.get():
            return super().wait(gen, interval, timeout)
        bound = ANSWER_TIMEOUT_S
        try:
            return super().wait(gen, interval, bound)
        except psycopg.errors._WaitTimeout:
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"the database did not answer within {bound:g} s; connection closed"
            ) from None


@contextmanager
def _unbounded() -> Iterator[None]:
    """Database work that may legitimately take long (migrations, and waiting for another
    replica's under the advisory lock) is not bounded by ANSWER_TIMEOUT_S."""
    token = _unbounded_now.set(True)
    try:
        yield
    finally:
        _unbounded_now.reset(token)


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
        # The connection used last is handed out first: a SQLite connection keeps its page
        # cache only while no other connection wrote since its last transaction, so a FIFO
        # pool cycling through its idle connections made each invoke's read fetch its pages
        # again (~20 pread calls a call, 3 with LIFO; docs/decisions/110-connection-pool.md). The
        # same order on PostgreSQL (not measured there; idle connections that time out are
        # replaced when their ping fails: _ping_idle).
        kwargs: dict[str, Any] = {"pool_use_lifo": True}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_S}
            kwargs["pool_size"] = pool_size
        else:
            # A ping replaces connections a restarted server dropped, so the service recovers
            # by itself (_ping_idle: only connections idle for PING_IDLE_S); the timeouts make
            # an outage a fast 503, never a hang: a new connection within CONNECT_TIMEOUT_S,
            # each answer on an open one within ANSWER_TIMEOUT_S (_BoundedConnection), a
            # free connection within POOL_TIMEOUT_S.
            kwargs.update(
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=POOL_TIMEOUT_S,
            )
            given = sa.make_url(url).query
            args: dict[str, Any] = {k: v for k, v in KEEPALIVE_ARGS.items() if k not in given}
            if "connect_timeout" not in given:
                args["connect_timeout"] = CONNECT_TIMEOUT_S
            kwargs["connect_args"] = args
        self.engine = sa.create_engine(url, **kwargs)
        if not self.is_sqlite:

            @sa.event.listens_for(self.engine, "do_connect")
            def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
                return _BoundedConnection.connect(*cargs, **cparams)

            _ping_idle(self.engine)

        # Every statement counts: SQLAlchemy's own, and the prepared ones (on_cursor tells
        # the same listeners).
        sa.event.listen(self.engine, "before_cursor_execute", count_statement)

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
            on_cursor(conn, "BEGIN" if readonly else "BEGIN IMMEDIATE", counted=False)

    @contextmanager
    def transaction(
        self, readonly: bool = False, *, one_statement: bool = False
    ) -> Iterator[SqlUnitOfWork]:
        """One unit of work. A unique-constraint race that slipped past the services'
        checks becomes a Conflict, never a 500; a database that cannot be reached becomes
        ServiceUnavailable (503 ``unavailable``), for every transport alike.

        ``one_statement=True`` (with ``readonly``) is for a unit that runs a single read
        (the status re-read at a run's admission): on PostgreSQL it runs in autocommit, one
        round trip instead of three (BEGIN, the statement, COMMIT;
        docs/decisions/108-one-read-per-call.md), which for one statement reads the same (a lone
        statement is its own transaction, with a snapshot taken when it starts). A second statement
        in such a unit raises (it would be committed apart from the first). SQLite has no round
        trips to save: a plain read transaction as before, with the same guard."""
        if one_statement and not readonly:
            raise ValueError("one_statement is for a read")
        try:
            with contextlib.nullcontext() if readonly else self._writer:
                with self.engine.connect() as conn:
                    # The pooled connection's own dict, kept: ``conn.info`` on a connection
                    # lost in the unit would connect anew (to clean up after an outage).
                    info = conn.info
                    info["toolkiln_readonly"] = readonly
                    if one_statement:
                        info[ONE_STATEMENT] = 1
                        if not self.is_sqlite:
                            # psycopg's autocommit flag, set locally (no round trip); the
                            # pool resets it when the connection is returned (or replaces
                            # the connection, if invalidated). The reset names the level
                            # the server reported at the first connect, so later BEGINs
                            # on that connection say READ COMMITTED (the default) outright.
                            conn.execution_options(isolation_level="AUTOCOMMIT")
                    try:
                        with conn.begin():
                            unit = SqlUnitOfWork(conn)
                            yield unit
                            unit.before_commit()
                    finally:
                        info.pop(ONE_STATEMENT, None)  # info outlives the checkout
        except sa.exc.IntegrityError as exc:
            raise Conflict("The change conflicts with existing data.", code="conflict") from exc
        except sa.exc.SQLAlchemyError as exc:
            if not is_outage(exc):
                raise
            log.warning("database unreachable: %s", str(exc).splitlines()[0])
            full = "database or disk is full" in str(exc).lower()
            why = DISK_FULL if full else UNREACHABLE
            raise ServiceUnavailable(why, code="unavailable") from exc

    def shared_secret(self, name: str, seed: str) -> str:
        """The secret ``name`` every replica on this database reads: the first to ask
        stores ``seed``, later ones (and restarts) get what was stored."""
        table = tables.service_secrets
        insert = (pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert)(table)
        with self.engine.begin() as conn:
            conn.execute(insert.values(name=name, value=seed).on_conflict_do_nothing())
            value = conn.execute(sa.select(table.c.value).where(table.c.name == name)).scalar_one()
        return str(value)

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
        """None when the database answers and (SQLite) its disk has room; else why not, in
        one line (for /healthz). With the disk full, reads answered and every write failed
        while /healthz said ok, so a load balancer kept sending calls (found by an outside
        review)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError as exc:
            return _cause(exc)
        return self._disk_problem()

    def _disk_problem(self) -> str | None:
        path = sa.make_url(self.url).database if self.is_sqlite else None
        if not path or path == ":memory:":
            return None
        try:
            room = os.statvfs(Path(path).resolve().parent)
        except OSError:
            return None
        free = room.f_bavail * room.f_frsize
        if free < MIN_FREE_BYTES:
            return f"{DISK_FULL} ({free} bytes free where the SQLite file is)"
        return None

    def migrate(self) -> str | None:
        """Bring the schema to the newest migration (idempotent); the revision it migrated
        to, or None when the schema was at head already.

        At head (every start but the first after an upgrade) Alembic is not even imported:
        one ``SELECT`` on ``alembic_version`` decides, so a CLI command stays quick and
        quiet.

        Replicas started together on a new database must not all create it: on PostgreSQL
        the upgrade runs under a transaction-scoped advisory lock, on SQLite under the
        write lock that ``BEGIN IMMEDIATE`` takes. Whoever waits finds the schema at head.

        The check at head has the usual bound on each answer (ANSWER_TIMEOUT_S), so a start
        against a server that does not answer fails; the locked part has none: an upgrade
        may take long, and so may waiting for another replica's.
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
        with self.engine.connect() as conn:
            conn.info["toolkiln_readonly"] = True  # SQLite: a plain BEGIN, no write lock
            with conn.begin():
                if _at_head(conn):
                    return None
        with _unbounded(), self.engine.connect() as conn:
            conn.info["toolkiln_readonly"] = False  # SQLite: BEGIN IMMEDIATE, the write lock
            with conn.begin():
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
