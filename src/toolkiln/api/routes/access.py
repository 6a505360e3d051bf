"""Workspaces, tokens and workspace policy."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from toolkiln.api import models, serialize
from toolkiln.api.deps import Admin, Reader, Svc, Writer

router = APIRouter(prefix="/v1", tags=["workspaces and tokens"])


@router.post("/workspaces", status_code=201, response_model=models.One[models.Workspace])
def create_workspace(body: models.WorkspaceIn, who: Admin, svc: Svc) -> dict[str, Any]:
    return {"data": serialize.workspace(svc.access.create_workspace(who, body.name))}


@router.get("/workspaces", response_model=models.Many[models.Workspace])
def list_workspaces(who: Reader, svc: Svc) -> dict[str, Any]:
    items = svc.access.list_workspaces(who)
    return {"data": [serialize.workspace(w) for w in items], "next_cursor": None}


@router.get("/workspaces/{workspace_id}", response_model=models.One[models.Workspace])
def get_workspace(workspace_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    return {"data": serialize.workspace(svc.access.get_workspace(who, workspace_id))}


@router.get("/workspaces/{workspace_id}/policy", response_model=models.One[models.Policy])
def get_policy(workspace_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    return {"data": serialize.policy(svc.access.get_policy(who, workspace_id))}


@router.patch("/workspaces/{workspace_id}/policy", response_model=models.One[models.Policy])
def patch_policy(
    workspace_id: str, body: models.PolicyPatch, who: Writer, svc: Svc
) -> dict[str, Any]:
    change = body.model_dump(exclude_unset=True, exclude_none=True)
    return {"data": serialize.policy(svc.access.patch_policy(who, workspace_id, change))}


@router.post("/tokens", status_code=201, response_model=models.One[models.TokenIssued])
def create_token(body: models.TokenIn, who: Admin, svc: Svc) -> dict[str, Any]:
    issued = svc.access.create_token(who, body.workspace_id, list(body.scopes), body.name)
    return {"data": serialize.token(issued.record, issued.value)}


@router.get("/tokens", response_model=models.Many[models.Token])
def list_tokens(who: Admin, svc: Svc, workspace_id: models.Filter = None) -> dict[str, Any]:
    items = svc.access.list_tokens(who, workspace_id)
    return {"data": [serialize.token(t) for t in items], "next_cursor": None}


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(token_id: str, who: Admin, svc: Svc) -> Response:
    svc.access.revoke_token(who, token_id)
    return Response(status_code=204)
