"""Invoking tools, testing unsaved ones, run-code, stored calls and the runtimes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from toolkiln.api import models, serialize
from toolkiln.api.deps import Invoker, Reader, Svc, Work, Writer, bearer_of
from toolkiln.api.middleware import content_kind, is_json, replay_body
from toolkiln.api.offload import Offload
from toolkiln.api.routes.tools import draft_of
from toolkiln.domain.auth import Bearer, Principal
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
    # Only what FastInvoke (below) does not take reaches this route: a body that is not
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
    if who is not None:
        credential: Principal | Bearer = who
        turn = who.workspace_id
    else:
        credential = Bearer(bearer_of(request))
        turn = svc.invoke.turn_key(credential.value)
    result = await offload(svc.invoke.invoke, credential, tool_id, body.input, context, turn=turn)
    # The Result is built by the domain: hand FastAPI a finished response instead of having
    # it validate and re-encode the dict (response_model stays for the document).
    return JSONResponse({"data": result.as_dict()})


_FALLBACK = "toolkiln.invoke.fallback"


class FastInvoke(Route):
    """``POST /v1/custom-tools/{tool_id}/invoke`` for a body that is valid, without FastAPI's
    request handling (routing through the included routers, dependency solving, parameter
    validation): the route every tool call takes (docs/decisions/111-invoke-route.md). The body is
    parsed and validated as FastAPI does it (``json.loads``, then the same model); anything else
    (not JSON, invalid, no body) goes to FastAPI's own route above, whose answers (its 422s) are
    the document's. Errors of the call itself reach the app's exception handlers as from any
    route. Mounted first by ``create_app``."""

    def __init__(self, fallback: ASGIApp) -> None:
        super().__init__(
            "/v1/custom-tools/{tool_id}/invoke",
            _Asgi(self._serve),  # an ASGI app, not a request-response function
            methods=["POST"],
            name="invoke_tool",
            include_in_schema=False,
        )
        self._fallback = fallback

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get(_FALLBACK):
            return Match.NONE, {}
        match, child = super().matches(scope)
        if match is not Match.NONE:
            # What FastAPI's routes put there, so that /metrics counts this route by its
            # template too (a plain Route does not; it was counted as "unmatched").
            child["route"] = self
        return match, child

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            if not _json_declared(scope):
                raise ValueError("FastAPI reads this body as JSON only when it says it is JSON")
            body = models.InvokeIn.model_validate(json.loads(raw))
        except (ValueError, RecursionError, ValidationError):  # not JSON, not valid: FastAPI
            scope[_FALLBACK] = True
            await self._fallback(scope, replay_body(raw, receive), send)
            return
        request = Request(scope, receive)
        response = await _invoke(request, scope["path_params"]["tool_id"], body)
        await response(scope, receive, send)


def _json_declared(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return is_json(content_kind(value))
    return False  # none: FastAPI's route decides what such a body is


class _Asgi:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


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
