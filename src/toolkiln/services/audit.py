"""Reading the audit trail."""

from __future__ import annotations

from toolkiln.domain.auth import Principal
from toolkiln.domain.records import AuditFilter, AuditRow, Page
from toolkiln.services.paging import clamp_limit, decode_cursor, encode_cursor
from toolkiln.services.ports import UnitOfWorkFactory


class AuditService:
    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    def page(
        self, principal: Principal, where: AuditFilter, cursor: str | None, limit: int | None
    ) -> Page[AuditRow]:
        principal.require("read")
        if where.workspace_id is not None:
            principal.require_workspace(where.workspace_id)
        elif not principal.is_admin:
            where.workspace_id = principal.workspace_id
        size = clamp_limit(limit)
        with self._uow(readonly=True) as tx:
            rows = tx.audit.page(where, decode_cursor(cursor), size + 1)
        more = len(rows) > size
        rows = rows[:size]
        last = rows[-1].id if rows and more else None
        return Page(rows, encode_cursor(last) if last is not None else None)
