"""Reading the workspace outbox, where send_email puts messages when no SMTP is configured."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.opaque import Positions
from toolkiln.domain.records import Page
from toolkiln.services.paging import after, clamp_limit, listing_scope, page_of
from toolkiln.services.ports import UnitOfWorkFactory


class OutboxService:
    def __init__(self, uow: UnitOfWorkFactory, positions: Positions) -> None:
        self._uow = uow
        self._positions = positions

    def page(
        self, principal: Principal, workspace_id: str | None, cursor: str | None, limit: int | None
    ) -> Page[dict[str, Any]]:
        scope = listing_scope(principal, workspace_id)
        size = clamp_limit(limit)
        start = after(self._positions, "outbox-cursor", cursor)
        with self._uow(readonly=True) as tx:
            rows = tx.outbox.page(scope, start, size + 1)
        return page_of(rows, size, lambda r: int(r["seq"]), self._positions, "outbox-cursor")
