"""A tool's call counts per minute and outcome (``tool_call_stats``): one upsert per stored
call, and a window read grouped by bucket in the database."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from toolkiln.domain.stats import BUCKETS, StatsRow, duration_bucket
from toolkiln.storage.prepared import Prepared
from toolkiln.storage.tables import tool_call_stats as t

_COUNTS = ["calls", *(f"d{i}" for i in range(BUCKETS))]
_KEYS = ["tool_id", "minute", "code", *_COUNTS]


def _upsert(insert: Any) -> Prepared:
    statement = insert(t)
    statement = statement.on_conflict_do_update(
        index_elements=[t.c.tool_id, t.c.minute, t.c.code],
        set_={c: t.c[c] + statement.excluded[c] for c in _COUNTS},
    )
    return Prepared(statement, _KEYS)


# Each dialect's own upsert (ON CONFLICT ... DO UPDATE), prepared once.
_ADD = {"sqlite": _upsert(sqlite.insert), "postgresql": _upsert(postgresql.insert)}


class SqlStats:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    def add(self, tool_id: str, minute: int, code: str, duration_ms: float) -> None:
        """One call of the tool in that minute, with that code ("" for ok)."""
        params: dict[str, Any] = dict.fromkeys(_COUNTS, 0)
        params.update(tool_id=tool_id, minute=minute, code=code, calls=1)
        params[f"d{duration_bucket(duration_ms)}"] = 1
        _ADD[self._c.dialect.name].run(self._c, params)

    def prune(self, before: int) -> int:
        """Rows of minutes before ``before``, deleted (by ``ix_tool_call_stats_minute``); how
        many."""
        return int(self._c.execute(t.delete().where(t.c.minute < before)).rowcount or 0)

    def window(self, tool_id: str, first: int, count: int, minutes: int) -> list[StatsRow]:
        """The tool's rows from bucket ``first`` on (``count`` buckets of ``minutes``),
        summed per bucket and code: at most one row per minute of the window and code is
        read (the primary key's range)."""
        bucket = (t.c.minute // minutes).label("bucket")
        since, until = first * minutes, (first + count) * minutes
        q = (
            sa.select(bucket, t.c.code, *(sa.func.sum(t.c[c]) for c in _COUNTS))
            .where(t.c.tool_id == tool_id, t.c.minute >= since, t.c.minute < until)
            .group_by(bucket, t.c.code)
        )
        return [
            StatsRow(int(r[0]), str(r[1]), int(r[2]), tuple(int(v) for v in r[3:]))
            for r in self._c.execute(q)
        ]
