"""Built-in tools, the outbox, and signed file downloads."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import Field

from toolkiln.api import models
from toolkiln.api.deps import Calls, Invoker, Reader, Svc
from toolkiln.domain.ids import rfc3339
from toolkiln.services.calls import CallContext
from toolkiln.services.files import safe_filename

router = APIRouter(prefix="/v1", tags=["built-in tools"])


class BuiltinCallIn(models.Body):
    input: Any = Field(default_factory=dict)
    agent_id: str | None = models.client_id()
    tool_call_id: str | None = models.client_id()


@router.get("/builtin-tools")
def list_builtins(who: Reader, svc: Svc) -> dict[str, Any]:
    who.require("read")
    specs = svc.router.specs()
    return {
        "data": [
            {"name": s.name, "description": s.description, "input_schema": s.input_schema}
            for s in specs
        ],
        "next_cursor": None,
    }


@router.post("/builtin-tools/{name}/call", responses=models.LONG_WORK)
async def call_builtin(
    name: str, body: BuiltinCallIn, who: Invoker, svc: Svc, pool: Calls
) -> dict[str, Any]:
    """Call a built-in the way a model does: same checks, allowlists and audit as tool code
    (``run_code`` takes a place of the workspace's long work)."""
    context = CallContext.of(body.tool_call_id, body.agent_id)
    call = svc.invoke.call_builtin
    return {"data": await pool(call, who, name, body.input, context, turn=who.workspace_id)}


@router.get("/outbox")
def list_outbox(
    who: Reader,
    svc: Svc,
    workspace_id: models.Filter = None,
    cursor: models.Cursor = None,
    limit: models.Limit = None,
) -> dict[str, Any]:
    page = svc.outbox.page(who, workspace_id, cursor, limit)
    return {
        "data": [
            {
                "id": r["id"],
                "workspace_id": r["workspace_id"],
                "message_id": r["message_id"],
                "to": r["recipients"]["to"],
                "cc": r["recipients"]["cc"],
                "reply_to": r["reply_to"],
                "subject": r["subject"],
                "body_text": r["body_text"],
                "body_html": r["body_html"],
                "source": r["source"],
                "tool_call_id": r["tool_call_id"],
                "created_at": rfc3339(r["created_at"]),
            }
            for r in page.items
        ],
        "next_cursor": page.next_cursor,
    }


@router.get("/files/{file_id}", include_in_schema=True)
def get_file(file_id: str, svc: Svc, expires: str = "", sig: str = "") -> Response:
    """No token: the signed URL is the permission. Tampered or expired: 403. Served as
    nothing a browser runs: an inert type (``services.files.served_type``), as an
    attachment, never sniffed, and in a sandbox with no sources of its own if it is opened."""
    served = svc.files.open(file_id, expires, sig)
    name = safe_filename(served.filename)
    return Response(
        served.content,
        media_type=served.mime_type,
        headers={
            "Content-Disposition": (
                f"attachment; filename=\"{name}\"; filename*=UTF-8''{quote(name)}"
            ),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private, no-store",
        },
    )
