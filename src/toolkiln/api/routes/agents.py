"""Agents, their tools in provider formats, and the one dispatch call."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator
from starlette.types import ASGIApp

from toolkiln.api import models
from toolkiln.api.deps import Invoker, Reader, Svc, Writer, call_credential
from toolkiln.api.fast import FastRoute
from toolkiln.api.offload import Offload
from toolkiln.domain.auth import Principal
from toolkiln.domain.ids import rfc3339
from toolkiln.domain.records import Agent
from toolkiln.services.calls import CallContext
from toolkiln.services.container import Services

router = APIRouter(prefix="/v1/agents", tags=["agents"])


class AgentIn(models.Body):
    workspace_id: models.RefId
    name: str = Field(**models.LABEL)


class EnableIn(models.Body):
    version: models.VersionNumber | None = None


class ToolCallIn(models.Body):
    name: models.RefId = Field(min_length=1)
    arguments: Any = Field(default_factory=dict)
    tool_call_id: str | None = models.client_id()
    conversation_id: str | None = models.client_id()
    power_user_id: str | None = models.client_id()

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        """OpenAI hands a tool call's arguments over as JSON text
        (``tool_calls[].function.arguments``): text that is the JSON of an object is taken
        as that object. Any other value, and text that is not, go on as given, to be judged
        by the tool's schema like any input (``invalid_input`` naming where)."""
        if not isinstance(value, str):
            return value
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if isinstance(parsed, dict) else value


def _agent(a: Agent) -> dict[str, Any]:
    return {
        "id": a.id,
        "workspace_id": a.workspace_id,
        "name": a.name,
        "created_at": rfc3339(a.created_at),
    }


@router.post("", status_code=201)
def create_agent(body: AgentIn, who: Writer, svc: Svc) -> dict[str, Any]:
    return {"data": _agent(svc.agents.create(who, body.workspace_id, body.name))}


@router.get("")
def list_agents(who: Reader, svc: Svc, workspace_id: models.Filter = None) -> dict[str, Any]:
    return {"data": [_agent(a) for a in svc.agents.all(who, workspace_id)], "next_cursor": None}


@router.get("/{agent_id}")
def get_agent(agent_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    return {"data": _agent(svc.agents.get(who, agent_id))}


@router.delete("/{agent_id}", status_code=204)
def delete_agent(agent_id: str, who: Writer, svc: Svc) -> Response:
    svc.agents.delete(who, agent_id)
    return Response(status_code=204)


@router.get("/{agent_id}/custom-tools")
def enabled_tools(agent_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    """The agent's own enablements (global tools are not listed): ``{tool_id, version}``."""
    return {"data": svc.agents.enabled_tools(who, agent_id), "next_cursor": None}


@router.put("/{agent_id}/custom-tools/{tool_id}")
def enable_tool(
    agent_id: str, tool_id: str, who: Writer, svc: Svc, body: EnableIn | None = None
) -> dict[str, Any]:
    version = body.version if body else None
    return {"data": svc.agents.enable_tool(who, agent_id, tool_id, version)}


@router.delete("/{agent_id}/custom-tools/{tool_id}", status_code=204)
def disable_tool(agent_id: str, tool_id: str, who: Writer, svc: Svc) -> Response:
    svc.agents.disable_tool(who, agent_id, tool_id)
    return Response(status_code=204)


# The list's body is sent as the service encoded it once (services/tool_lists.py); its shape,
# for the OpenAPI document.
TOOL_LIST = {
    "type": "object",
    "properties": {
        "data": {"type": "array", "items": {"type": "object"}},
        "next_cursor": {"type": "null"},
    },
    "required": ["data", "next_cursor"],
}


@router.get(
    "/{agent_id}/tools",
    responses={200: {"content": {"application/json": {"schema": TOOL_LIST}}}},
)
def agent_tools(
    agent_id: str,
    who: Reader,
    svc: Svc,
    format: Literal["openai", "anthropic", "mcp"] = "openai",
    strict: bool = False,
    mode: Literal["direct", "code"] = "direct",
    language: Literal["python", "javascript"] = "python",
    names: Literal["id", "name"] = "id",
) -> Response:
    """``mode=code``: one ``run_program`` tool whose description declares the agent's
    code-mode tools as signatures in ``language``. ``names=name``: each custom tool under its
    own name where every format allows it and no built-in has it, else ``custom_{id}``."""
    listing = svc.agents.listing(who, agent_id, format, strict, mode, language, names)
    return Response(listing.body, media_type="application/json")  # encoded once per list


@router.post(
    "/{agent_id}/tool-calls",
    response_model=models.One[models.Result],
    responses=models.LONG_WORK,
    # The fast path reads the token in the call's own read, not by a dependency: the
    # document says it is needed either way.
    openapi_extra={"security": [{"bearer": []}]},
)
async def tool_call(agent_id: str, body: ToolCallIn, request: Request, who: Invoker) -> Response:
    """On the tool-call pool (api/offload.py); ``run_program`` and ``run_code`` take a place
    of the workspace's long work (429 when none is free). Only what ``fast_tool_call`` does
    not take reaches this route: the Invoker dependency answers a missing or bad token with
    401 and a token without ``invoke`` with 403 before FastAPI judges the body."""
    return await _tool_call(request, agent_id, body, who)


async def _tool_call(
    request: Request, agent_id: str, body: ToolCallIn, who: Principal | None = None
) -> Response:
    """The call on the app's call pool; the token is checked by the call's own read unless
    the caller is known already (as for invoke: api/routes/invoke.py)."""
    svc: Services = request.app.state.services
    offload: Offload = request.app.state.offload
    context = CallContext.of(
        body.tool_call_id, conversation_id=body.conversation_id, power_user_id=body.power_user_id
    )
    credential, turn = call_credential(request, who)
    call = (credential, agent_id, body.name, body.arguments, context)
    result = await offload(svc.agents.dispatch, *call, turn=turn)
    # The Result is built by the domain: a finished response, not one FastAPI validates and
    # encodes again (response_model stays for the document).
    return JSONResponse({"data": result.as_dict()})


def fast_tool_call(fallback: ASGIApp) -> FastRoute[ToolCallIn]:
    """``POST /v1/agents/{agent_id}/tool-calls`` for a body that is valid (api/fast.py)."""
    path = "/v1/agents/{agent_id}/tool-calls"
    return FastRoute(path, "tool_call", "agent_id", ToolCallIn, _tool_call, fallback)
