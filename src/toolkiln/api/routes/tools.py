"""The custom-tool registry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel

from toolkiln.api import models, serialize
from toolkiln.api.deps import Reader, Svc, Work, Writer
from toolkiln.domain import limits
from toolkiln.domain.tools import DRAFT_FIELDS, ToolDraft

VersionNumber = Annotated[int, Path(ge=1, le=limits.MAX_VERSION)]

router = APIRouter(prefix="/v1/custom-tools", tags=["custom tools"])


def draft_of(body: models.ToolCreate) -> ToolDraft:
    # exclude_unset keeps "expect: {raw_data: null}" apart from an expect without raw_data.
    values = body.model_dump(include=set(DRAFT_FIELDS) - {"test_cases"})
    values["description"] = values["description"] or ""
    values["test_cases"] = [c.model_dump(exclude_unset=True) for c in body.test_cases]
    return ToolDraft.of(**values)


@router.post(
    "",
    status_code=201,
    response_model=models.One[models.Tool],
    name="create_tool",
    responses=models.LONG_WORK,
)
async def create_tool(body: models.ToolCreate, who: Writer, svc: Svc, pool: Work) -> dict[str, Any]:
    """Its test cases run in a place of the workspace's long work (429 when none is free),
    on the long-work pool (api/offload.py)."""
    draft = draft_of(body)
    tool = await pool(svc.tools.create, who, body.workspace_id, draft, body.allow_failing_tests)
    return {"data": serialize.tool(tool)}


class Validation(BaseModel):
    valid: bool
    input_schema: dict[str, Any]


@router.post("/validate", response_model=models.One[Validation], name="validate_tool")
def validate_tool(body: models.ToolCreate, who: Writer, svc: Svc) -> dict[str, Any]:
    """Check a definition as a create would, storing nothing: 200, or 422 with every problem
    (the view calls this as the user types)."""
    who.require("write")
    definition = svc.tools.validate(who, body.workspace_id, draft_of(body))
    return {"data": {"valid": True, "input_schema": definition.input_schema}}


@router.get("", response_model=models.Many[models.Tool])
def list_tools(
    who: Reader,
    svc: Svc,
    workspace_id: models.Filter = None,
    cursor: models.Cursor = None,
    limit: models.Limit = None,
) -> dict[str, Any]:
    page = svc.tools.page(who, workspace_id, cursor, limit)
    return {"data": [serialize.tool(t) for t in page.items], "next_cursor": page.next_cursor}


@router.get("/{tool_id}", response_model=models.One[models.Tool])
def get_tool(tool_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    return {"data": serialize.tool(svc.tools.get(who, tool_id))}


@router.get("/{tool_id}/stats", response_model=models.One[models.ToolStats], name="tool_stats")
def tool_stats(
    tool_id: str,
    who: Reader,
    svc: Svc,
    window: Annotated[Literal["1h", "24h", "7d"], Query()] = "24h",
) -> dict[str, Any]:
    """The tool's stored calls over the window, per time bucket (1 min, 15 min, 1 h): calls,
    failures by error code, p50 and p99 duration (estimated from duration buckets); empty
    buckets included. Read from per-minute counts: its cost does not grow with the calls."""
    return {"data": svc.tools.stats(who, tool_id, window)}


@router.patch(
    "/{tool_id}",
    response_model=models.One[models.Tool],
    name="update_tool",
    responses=models.LONG_WORK,
)
async def update_tool(
    tool_id: str, body: models.ToolPatch, who: Writer, svc: Svc, pool: Work
) -> dict[str, Any]:
    change = body.model_dump(exclude_unset=True)
    allow = bool(change.pop("allow_failing_tests", False))
    base = change.pop("base_version", None)
    return {"data": serialize.tool(await pool(svc.tools.update, who, tool_id, change, allow, base))}


@router.post(
    "/{tool_id}/run-tests", response_model=models.One[models.TestRun], responses=models.LONG_WORK
)
async def run_tests(
    tool_id: str,
    who: Writer,
    svc: Svc,
    pool: Work,
    version: Annotated[int | None, Query(ge=1, le=limits.MAX_VERSION)] = None,
) -> dict[str, Any]:
    """Run a version's test cases now (the current version by default); nothing is counted."""
    return {"data": (await pool(svc.tools.run_tests, who, tool_id, version)).as_dict()}


@router.delete("/{tool_id}", status_code=204)
def delete_tool(tool_id: str, who: Writer, svc: Svc) -> Response:
    svc.tools.delete(who, tool_id)
    return Response(status_code=204)


@router.post("/{tool_id}/enable", response_model=models.One[models.Tool])
def enable_tool(
    tool_id: str, who: Writer, svc: Svc, body: models.EnableIn | None = None
) -> dict[str, Any]:
    # The body is optional and has no fields; one that is sent is judged like any other
    # (malformed JSON 400, an unknown field 422), as for disable.
    del body
    return {"data": serialize.tool(svc.tools.enable(who, tool_id))}


@router.post("/{tool_id}/disable", response_model=models.One[models.Tool])
def disable_tool(
    tool_id: str, who: Writer, svc: Svc, body: models.DisableIn | None = None
) -> dict[str, Any]:
    reason = body.reason if body else None
    return {"data": serialize.tool(svc.tools.disable(who, tool_id, reason))}


@router.get("/{tool_id}/versions", response_model=models.Many[models.ToolVersion])
def list_versions(tool_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    items = svc.tools.versions(who, tool_id)
    return {"data": [serialize.tool_version(v) for v in items], "next_cursor": None}


@router.get("/{tool_id}/versions/{number}", response_model=models.One[models.ToolVersion])
def get_version(tool_id: str, number: VersionNumber, who: Reader, svc: Svc) -> dict[str, Any]:
    return {"data": serialize.tool_version(svc.tools.version(who, tool_id, number))}
