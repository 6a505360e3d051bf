"""Reading the audit trail."""

from __future__ import annotations

from toolkiln.domain.auth import Principal
from toolkiln.domain.records import AuditFilter, AuditRow, Page
from toolkiln.services.paging import clamp_limit, decode_cursor, listing_scope, page_of
from toolkiln.services.ports import UnitOfWorkFactory


class AuditService:
    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    def page(
        self, principal: Principal, where: AuditFilter, cursor: str | None, limit: int | None
    ) -> Page[AuditRow]:
        where.workspace_id = listing_scope(principal, where.workspace_id)
        size = clamp_limit(limit)
        with self._uow(readonly=True) as tx:
            rows = tx.audit.page(where, decode_cursor(cursor), size + 1)
        return page_of(rows, size, lambda r: r.id or 0)
