"""Invoking tools, testing unsaved ones, run-code, stored calls and the runtimes (CONTRACT 3-4)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from toolkiln.api import models, serialize
from toolkiln.api.deps import Caller, Svc, bearer_of
from toolkiln.api.offload import Offload
from toolkiln.api.routes.tools import draft_of
from toolkiln.domain.auth import Bearer
from toolkiln.services.container import Services
from toolkiln.services.invoke import CallContext

router = APIRouter(prefix="/v1", tags=["invoking"])


@router.get("/custom-tools/runtimes", response_model=models.One[models.Runtimes])
def runtimes(who: Caller, svc: Svc) -> dict[str, Any]:
    who.require("read")
    return {"data": svc.system.runtimes()}


@router.post("/custom-tools/test", response_model=models.One[models.Result], name="test_tool")
def test_tool(body: models.ToolTest, who: Caller, svc: Svc) -> dict[str, Any]:
    result = svc.invoke.test(who, body.workspace_id, draft_of(body), body.input)
    return {"data": result.as_dict()}


@router.post(
    "/custom-tools/{tool_id}/invoke",
    response_model=models.One[models.Result],
    # The token is read below, not by a dependency; the document still says it is needed.
    openapi_extra={"security": [{"bearer": []}]},
)
async def invoke_tool(tool_id: str, body: models.InvokeIn, request: Request) -> JSONResponse:
    # The token is checked by the invoke's own read rather than by the Caller dependency
    # (a dependency of its own would cost a read transaction and, sync, a thread hop), and
    # the work runs on the app's own thread pool (api/offload.py), not FastAPI's hand-off.
    svc: Services = request.app.state.services
    offload: Offload = request.app.state.offload
    context = CallContext(
        tool_call_id=body.tool_call_id,
        agent_id=body.agent_id,
        conversation_id=body.conversation_id,
        power_user_id=body.power_user_id,
        source="llm" if body.agent_id else "api",
    )
    bearer = Bearer(bearer_of(request))
    result = await offload(svc.invoke.invoke, bearer, tool_id, body.input, context)
    # The Result is built by the domain: hand FastAPI a finished response instead of having
    # it validate and re-encode the dict (response_model stays for the document).
    return JSONResponse({"data": result.as_dict()})


@router.post("/run-code", response_model=models.One[models.Result])
def run_code(body: models.RunCodeIn, who: Caller, svc: Svc) -> dict[str, Any]:
    context = CallContext(tool_call_id=body.tool_call_id)
    return {"data": svc.invoke.run_code(who, body.language, body.code, body.input, context)}


@router.get("/tool-calls/{tool_call_id}", response_model=models.One[models.StoredResult])
def get_tool_call(
    tool_call_id: str, who: Caller, svc: Svc, workspace_id: models.Filter = None
) -> dict[str, Any]:
    """A call of the token's workspace (ids are unique per workspace; an admin token may
    name the workspace, else gets the newest call with that id)."""
    record, rows = svc.invoke.get_call(who, tool_call_id, workspace_id)
    return {"data": {**record.result, "audit": [serialize.audit_row(r) for r in rows]}}
