"""Reading the audit trail."""

from __future__ import annotations

from dataclasses import replace

from toolkiln.domain.auth import Principal
from toolkiln.domain.opaque import Positions
from toolkiln.domain.records import AuditFilter, AuditRow, Page
from toolkiln.services.paging import after, clamp_limit, listing_scope, page_of
from toolkiln.services.ports import UnitOfWorkFactory


class AuditService:
    def __init__(self, uow: UnitOfWorkFactory, positions: Positions) -> None:
        self._uow = uow
        self.positions = positions

    def page(
        self, principal: Principal, where: AuditFilter, cursor: str | None, limit: int | None
    ) -> Page[AuditRow]:
        where.workspace_id = listing_scope(principal, where.workspace_id)
        size = clamp_limit(limit)
        start = after(self.positions, "audit-cursor", cursor)
        with self._uow(readonly=True) as tx:
            rows = tx.audit.page(where, start, size + 1)
        page = page_of(rows, size, _seq, self.positions, "audit-cursor")
        page.items = self.shown(page.items)
        return page

    def shown(self, rows: list[AuditRow]) -> list[AuditRow]:
        """The rows with the ids clients see (their places sealed)."""
        ids = self.positions.seal_all("audit", [_seq(r) for r in rows])
        return [replace(r, id=i) for r, i in zip(rows, ids, strict=True)]


def _seq(row: AuditRow) -> int:
    assert row.seq is not None, "a stored row has its place"
    return row.seq
