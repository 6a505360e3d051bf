"""Domain records to the JSON shapes of the contract."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.formats import schema_warnings
from toolkiln.domain.ids import rfc3339
from toolkiln.domain.records import AuditRow, Policy, TokenRecord, Workspace
from toolkiln.domain.schema.parameters import schema_to_parameters
from toolkiln.domain.secrets import SecretInfo
from toolkiln.domain.tools import Definition, Tool, ToolVersion


def workspace(w: Workspace) -> dict[str, Any]:
    return {"id": w.id, "name": w.name, "created_at": rfc3339(w.created_at)}


def token(t: TokenRecord, value: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": t.id,
        "workspace_id": t.workspace_id,
        "scopes": sorted(t.scopes),
        "name": t.name,
        "created_at": rfc3339(t.created_at),
        "revoked_at": rfc3339(t.revoked_at) if t.revoked_at else None,
    }
    if value is not None:
        out["token"] = value
    return out


def policy(p: Policy) -> dict[str, Any]:
    return p.as_dict()


def definition(d: Definition) -> dict[str, Any]:
    """A definition's fields, and its input schema as parameters where it can be one."""
    return {**d.as_dict(), "parameters": schema_to_parameters(d.input_schema)}


def tool(t: Tool) -> dict[str, Any]:
    return {
        "id": t.id,
        "workspace_id": t.workspace_id,
        "name": t.name,
        **definition(t.definition),
        "execution_message_description": t.execution_message_description,
        "enable_globally": t.enable_globally,
        "status": t.status,
        "disabled_reason": t.disabled_reason,
        "usage_count": t.usage_count,
        "failure_count": t.failure_count,
        "last_error": t.last_error,
        "validated": True,
        "warnings": schema_warnings(t.definition.input_schema),
        "version": t.version,
        "created_at": rfc3339(t.created_at),
        "updated_at": rfc3339(t.updated_at),
    }


def tool_version(v: ToolVersion) -> dict[str, Any]:
    return {
        "tool_id": v.tool_id,
        "version": v.version,
        **definition(v.definition),
        "created_at": rfc3339(v.created_at),
    }


def secret(s: SecretInfo) -> dict[str, Any]:
    return {
        "name": s.name,
        "hosts": list(s.hosts),
        "created_at": rfc3339(s.created_at),
        "updated_at": rfc3339(s.updated_at),
        "last_used_at": rfc3339(s.last_used_at) if s.last_used_at else None,
    }


def audit_row(r: AuditRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "workspace_id": r.workspace_id,
        "tool_call_id": r.tool_call_id,
        "tool_id": r.tool_id,
        "agent_id": r.agent_id,
        "source": r.source,
        "event": r.event,
        "data": r.data,
        "created_at": rfc3339(r.created_at) if r.created_at else None,
    }
