"""Invoking tools, testing unsaved ones, run-code, stored calls and the runtimes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp

from toolkiln.api import models, serialize
from toolkiln.api.deps import Invoker, Reader, Svc, Work, Writer, call_credential
from toolkiln.api.fast import FastRoute
from toolkiln.api.offload import Offload
from toolkiln.api.routes.tools import draft_of
from toolkiln.domain.auth import Principal
from toolkiln.services.calls import CallContext
from toolkiln.services.container import Services

router = APIRouter(prefix="/v1", tags=["invoking"])


@router.get("/custom-tools/runtimes", response_model=models.One[models.Runtimes])
def runtimes(who: Reader, svc: Svc) -> dict[str, Any]:
    who.require("read")
    return {"data": svc.system.runtimes()}


@router.post(
    "/custom-tools/test",
    response_model=models.One[models.Result],
    name="test_tool",
    responses=models.LONG_WORK,
)
async def test_tool(body: models.ToolTest, who: Writer, svc: Svc, pool: Work) -> dict[str, Any]:
    """A place of the workspace's long work while it runs (429 when none is free)."""
    result = await pool(svc.invoke.test, who, body.workspace_id, draft_of(body), body.input)
    return {"data": result.as_dict()}


@router.post(
    "/custom-tools/{tool_id}/invoke",
    response_model=models.One[models.Result],
    # The fast path reads the token in the call's own read, not by a dependency: the
    # document says it is needed either way.
    openapi_extra={"security": [{"bearer": []}]},
)
async def invoke_tool(
    tool_id: str, body: models.InvokeIn, request: Request, who: Invoker
) -> JSONResponse:
    # Only what fast_invoke (below) does not take reaches this route: a body that is not
    # valid, or is not declared as JSON. The Caller dependency answers a missing or bad
    # token with 401 before FastAPI judges the body, as on every other route;
    # the call a valid body makes then runs with that principal.
    return await _invoke(request, tool_id, body, who)


async def _invoke(
    request: Request, tool_id: str, body: models.InvokeIn, who: Principal | None = None
) -> JSONResponse:
    """The call, on the app's own thread pool (api/offload.py), not FastAPI's hand-off; the
    token is checked by the invoke's own read (a dependency of its own would cost a read
    transaction and, sync, a thread hop) unless the caller is known already."""
    svc: Services = request.app.state.services
    offload: Offload = request.app.state.offload
    context = CallContext.of(
        body.tool_call_id, body.agent_id, body.conversation_id, body.power_user_id
    )
    credential, turn = call_credential(request, who)
    result = await offload(svc.invoke.invoke, credential, tool_id, body.input, context, turn=turn)
    # The Result is built by the domain: hand FastAPI a finished response instead of having
    # it validate and re-encode the dict (response_model stays for the document).
    return JSONResponse({"data": result.as_dict()})


def fast_invoke(fallback: ASGIApp) -> FastRoute[models.InvokeIn]:
    """``POST /v1/custom-tools/{tool_id}/invoke`` for a body that is valid (api/fast.py): the
    route every tool call takes (docs/decisions/111-invoke-route.md)."""
    path = "/v1/custom-tools/{tool_id}/invoke"
    return FastRoute(path, "invoke_tool", "tool_id", models.InvokeIn, _invoke, fallback)


@router.post("/run-code", response_model=models.One[models.Result], responses=models.LONG_WORK)
async def run_code(body: models.RunCodeIn, who: Invoker, svc: Svc, pool: Work) -> dict[str, Any]:
    """A place of the workspace's long work while it runs (429 when none is free)."""
    context = CallContext.of(body.tool_call_id)
    run = svc.invoke.run_code
    return {"data": await pool(run, who, body.language, body.code, body.input, context)}


@router.get("/tool-calls/{tool_call_id}", response_model=models.One[models.StoredResult])
def get_tool_call(
    tool_call_id: str, who: Reader, svc: Svc, workspace_id: models.Filter = None
) -> dict[str, Any]:
    """A call of the token's workspace (ids are unique per workspace; an admin token may
    name the workspace, else gets the newest call with that id)."""
    record, rows = svc.invoke.get_call(who, tool_call_id, workspace_id)
    return {"data": {**record.result, "audit": [serialize.audit_row(r) for r in rows]}}
