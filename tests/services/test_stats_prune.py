"""The stats' rows of minutes no window reads are deleted; the rest stay (SQLite and
PostgreSQL)."""

from __future__ import annotations

import secrets

from toolkiln.app import Runtime
from toolkiln.domain.ids import utcnow
from toolkiln.domain.stats import KEPT_MINUTES, minute_of, span_of
from toolkiln.services import stats


def test_rows_older_than_the_longest_window_are_pruned(runtime: Runtime) -> None:
    uow = runtime.database.transaction
    tool = "prune" + secrets.token_hex(8)
    now = minute_of(utcnow())
    old, kept = now - KEPT_MINUTES - 5, now - KEPT_MINUTES + 120
    with uow() as tx:
        for minute in (old, kept, now):
            tx.stats.add(tool, minute, "", 2.0)
    assert stats.prune(uow) >= 1
    first, count, minutes = span_of("7d", utcnow())
    with uow(readonly=True) as tx:
        rows = tx.stats.window(tool, first, count, minutes)
        # A window reaching back past the pruned minute: only it is gone.
        everything = tx.stats.window(tool, old // 60 - 1, (now - old) // 60 + 3, 60)
    assert sum(r.calls for r in rows) == 2
    assert sum(r.calls for r in everything) == 2
