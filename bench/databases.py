"""The databases a `make bench` run measures: SQLite (a file in each service's data
directory) and PostgreSQL, a fresh database per service on one server.

The server is ``TOOLKILN_BENCH_POSTGRES_URL`` (default the local one,
``postgresql+psycopg://root@127.0.0.1:5432/``); each service gets a database of its own
there, ``bench_<random>``, created through the database the URL names (``postgres`` when it
names none) and dropped after. A service never shares one: a second would find the first's
tools under the same names.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT = "postgresql+psycopg://root@127.0.0.1:5432/"
SERVER = os.environ.get("TOOLKILN_BENCH_POSTGRES_URL", DEFAULT)
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _admin(url: str) -> str:
    """The libpq URL of the database to create and drop databases through."""
    head, _, name = url.replace("postgresql+psycopg://", "postgresql://").rpartition("/")
    return f"{head}/{name.split('?')[0] or 'postgres'}"


def postgres_missing() -> str | None:
    """Why PostgreSQL cannot be measured (no driver, no server answering), or None."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(_admin(SERVER), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL answers at {SERVER} ({str(exc).strip().splitlines()[0]})"
    return None


@contextmanager
def fresh(kind: str) -> Iterator[str | None]:
    """A database for one service: None for SQLite (the service makes its own file), or the
    URL of a new PostgreSQL database, dropped when the block ends."""
    if kind == "sqlite":
        yield None
        return
    import psycopg

    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(_admin(SERVER), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{SERVER.split('?')[0].rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(_admin(SERVER), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def kinds() -> tuple[list[str], str | None]:
    """The databases to measure, and why PostgreSQL is not among them (or None)."""
    missing = postgres_missing()
    return (["sqlite"] if missing else ["sqlite", "postgresql"]), missing
