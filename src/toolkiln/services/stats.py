"""The stats' background loop: rows of minutes no window reads any more are deleted."""

from __future__ import annotations

import logging

from toolkiln.domain.ids import utcnow
from toolkiln.domain.stats import KEPT_MINUTES, minute_of
from toolkiln.services.background import Loop, periodic
from toolkiln.services.ports import UnitOfWorkFactory

log = logging.getLogger("toolkiln.stats")
PRUNE_EVERY_S = 3600.0


def prune(uow: UnitOfWorkFactory) -> int:
    """Delete the per-minute rows older than the longest window; how many there were."""
    with uow() as tx:
        return tx.stats.prune(minute_of(utcnow()) - KEPT_MINUTES)


def pruner(uow: UnitOfWorkFactory, every_s: float = PRUNE_EVERY_S) -> Loop:
    """A loop (``services.background``) that prunes at start and then every ``every_s``.
    Every replica runs one; a deletion another already made deletes nothing."""
    return periodic(
        lambda: prune(uow),
        every_s,
        "deleted %d rows of call stats older than the longest window",
        log,
    )
