"""Workspace secrets: values are written, never read back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from toolkiln.api import models, serialize
from toolkiln.api.deps import Reader, Svc, Writer

router = APIRouter(prefix="/v1/workspaces/{workspace_id}/secrets", tags=["secrets"])


@router.post("", status_code=201, response_model=models.One[models.SecretOut])
def create_secret(
    workspace_id: str, body: models.SecretIn, who: Writer, svc: Svc
) -> dict[str, Any]:
    made = svc.secrets.create(who, workspace_id, body.name, body.value, list(body.hosts))
    return {"data": serialize.secret(made)}


@router.get("", response_model=models.Many[models.SecretOut])
def list_secrets(workspace_id: str, who: Reader, svc: Svc) -> dict[str, Any]:
    items = svc.secrets.all(who, workspace_id)
    return {"data": [serialize.secret(s) for s in items], "next_cursor": None}


@router.patch("/{name}", response_model=models.One[models.SecretOut])
def update_secret(
    workspace_id: str, name: str, body: models.SecretPatch, who: Writer, svc: Svc
) -> dict[str, Any]:
    change = body.model_dump(exclude_unset=True)
    return {"data": serialize.secret(svc.secrets.update(who, workspace_id, name, change))}


@router.delete("/{name}", status_code=204)
def delete_secret(workspace_id: str, name: str, who: Writer, svc: Svc) -> Response:
    svc.secrets.delete(who, workspace_id, name)
    return Response(status_code=204)
