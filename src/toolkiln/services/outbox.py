"""Reading the workspace outbox, where send_email puts messages when no SMTP is configured."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.records import Page
from toolkiln.services.paging import clamp_limit, decode_cursor, encode_cursor
from toolkiln.services.ports import UnitOfWorkFactory


class OutboxService:
    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    def page(
        self, principal: Principal, workspace_id: str | None, cursor: str | None, limit: int | None
    ) -> Page[dict[str, Any]]:
        principal.require("read")
        if workspace_id is not None:
            principal.require_workspace(workspace_id)
        elif not principal.is_admin:
            workspace_id = principal.workspace_id
        size = clamp_limit(limit)
        with self._uow(readonly=True) as tx:
            rows = tx.outbox.page(workspace_id, decode_cursor(cursor), size + 1)
        more = len(rows) > size
        rows = rows[:size]
        return Page(rows, encode_cursor(rows[-1]["seq"]) if more else None)
