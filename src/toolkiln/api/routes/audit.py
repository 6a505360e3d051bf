"""The audit trail."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from toolkiln.api import models, serialize
from toolkiln.api.deps import Reader, Svc
from toolkiln.domain.records import AuditFilter

router = APIRouter(prefix="/v1", tags=["audit"])


@router.get("/audit", response_model=models.Many[models.AuditRow])
def list_audit(
    who: Reader,
    svc: Svc,
    workspace_id: models.Filter = None,
    tool_id: models.Filter = None,
    tool_call_id: models.Filter = None,
    agent_id: models.Filter = None,
    event: models.Filter = None,
    cursor: models.Cursor = None,
    limit: models.Limit = None,
) -> dict[str, Any]:
    where = AuditFilter(workspace_id, tool_id, tool_call_id, agent_id, event)
    page = svc.audit.page(who, where, cursor, limit)
    return {"data": [serialize.audit_row(r) for r in page.items], "next_cursor": page.next_cursor}
