"""Tool definitions in the shapes OpenAI, Anthropic and MCP expect (and OpenAI strict mode)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
FORMATS = ("openai", "anthropic", "mcp")

# Keywords OpenAI's strict mode accepts; a schema using any other cannot be strict.
_STRICT_KEYS = {"type", "properties", "required", "additionalProperties", "items", "enum",
                "description", "anyOf", "const", "title", "$schema"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One entry of an agent's tool list, before it is put in a provider's shape."""

    name: str
    description: str
    input_schema: dict[str, Any]
    kind: str  # "custom" | "builtin"
    tool_id: str | None = None
    version: int | None = None
    pinned: int | None = None  # the version the agent is pinned to, if any
    tool_name: str | None = None  # a custom tool's own name (code mode calls it by name)


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI strict-mode form: every property required, optional ones nullable, no extra
    properties, at every level; None when the schema uses keywords strict mode lacks."""

    def convert(node: Any) -> Any:
        if not isinstance(node, dict) or set(node) - _STRICT_KEYS:
            raise ValueError("not strict-able")
        out = {k: v for k, v in node.items() if k != "$schema"}
        if "anyOf" in out:
            out["anyOf"] = [convert(n) for n in out["anyOf"]]
        kind = out.get("type")
        if kind == "object" or "properties" in out:
            props = out.get("properties", {})
            required = set(out.get("required", []))
            new_props = {}
            for name, sub in props.items():
                converted = convert(sub)
                if name not in required:
                    converted = _nullable(converted)
                new_props[name] = converted
            out["properties"] = new_props
            out["required"] = list(props)
            if out.get("additionalProperties") not in (None, False):
                raise ValueError("not strict-able")
            out["additionalProperties"] = False
        if kind == "array" or "items" in out:
            if "items" not in out:
                raise ValueError("arrays need items in strict mode")
            out["items"] = convert(out["items"])
        return out

    try:
        return convert(copy.deepcopy(schema))  # type: ignore[no-any-return]
    except ValueError:
        return None


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if isinstance(kind, str):
        return (
            {**node, "type": [kind, "null"]}
            if "enum" not in node
            else {"anyOf": [node, {"type": "null"}]}
        )
    if isinstance(kind, list):
        return node if "null" in kind else {**node, "type": [*kind, "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def render(defs: list[ToolDef], fmt: str, strict: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in defs:
        schema = {k: v for k, v in d.input_schema.items() if k != "$schema"}
        if fmt == "openai":
            fn: dict[str, Any] = {
                "name": d.name,
                "description": d.description,
                "parameters": schema,
            }
            if strict:
                converted = strict_schema(schema)
                fn["strict"] = converted is not None
                if converted is not None:
                    fn["parameters"] = converted
            out.append({"type": "function", "function": fn})
        elif fmt == "anthropic":
            out.append({"name": d.name, "description": d.description, "input_schema": schema})
        else:
            out.append({"name": d.name, "description": d.description, "inputSchema": schema})
    return out
