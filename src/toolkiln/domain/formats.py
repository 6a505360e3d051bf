"""Tool definitions in the shapes OpenAI, Anthropic and MCP expect, as those providers
document them (docs/agents.md, "What the providers accept").

Two rules shape every entry:

- A tool's parameters schema has no ``oneOf``/``anyOf``/``allOf``/``not``/``enum`` at its top
  level (OpenAI and Anthropic refuse them there; MCP clients forward schemas to those
  providers). A schema that has them is *adapted* for the list: ``allOf`` branches are
  merged in, the properties of ``oneOf``/``anyOf`` branches become optional properties and
  the rule is said in the description, ``not`` and ``enum`` are left out. The adapted schema
  accepts everything the stored one does, and every call is still checked against the
  stored schema, so what the list leaves out is enforced as ``invalid_input``.
- ``strict: true`` (OpenAI) only where OpenAI's strict rules hold: see :func:`strict_schema`.

:func:`schema_warnings` says at save which of this will happen to a tool's schema.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolkiln.domain.problems import Problem, problem

FORMATS = ("openai", "anthropic", "mcp")
# What OpenAI and Anthropic refuse at the top level of a tool's parameters.
TOP_LEVEL_FORBIDDEN = ("oneOf", "anyOf", "allOf", "not", "enum")

# OpenAI Structured Outputs ("Supported schemas"): the keywords strict mode knows; a schema
# using any other keyword anywhere cannot be strict.
STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const",
        "anyOf", "description", "title", "$defs", "$ref", "$schema",
        "pattern", "format",
        "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "minItems", "maxItems",
    }
)  # fmt: skip
# Keywords that only narrow the values a schema accepts, and annotations: the strict form
# leaves them out (it then accepts a little more; every call is still checked against the
# full schema, so a value they refuse is an `invalid_input` the model can correct).
STRICT_DROPPED = frozenset(
    {
        "minLength", "maxLength", "uniqueItems", "minProperties", "maxProperties",
        "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
        "contentEncoding", "contentMediaType",
    }
)  # fmt: skip
STRICT_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
STRICT_MAX_DEPTH = 10
STRICT_MAX_PROPERTIES = 5000
STRICT_MAX_ENUM_VALUES = 1000
STRICT_MAX_STRING_TOTAL = 120_000

# A custom tool by its id, custom_{id}: its name in every tool list, and a name ctx.tools takes.
CUSTOM_PREFIX = "custom_"


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
    open_world: bool = False  # may reach the network (MCP's openWorldHint; domain/egress.py)


class NotStrict(ValueError):
    """The schema breaks one of OpenAI's strict rules (the message says which)."""


def for_providers(schema: dict[str, Any], description: str) -> tuple[dict[str, Any], str]:
    """The schema without top-level combinators (and ``$schema``), and the description with
    any rule that had to leave the schema."""
    out = {k: copy.deepcopy(v) for k, v in schema.items() if k != "$schema"}
    notes: list[str] = []
    properties: dict[str, Any] = out.setdefault("properties", {})
    required: list[str] = list(out.get("required", []))
    for branch in out.pop("allOf", []):
        if isinstance(branch, dict):
            for name, sub in branch.get("properties", {}).items():
                properties.setdefault(name, sub)
            required += [r for r in branch.get("required", []) if r not in required]
            if set(branch) - {"type", "properties", "required", "description", "title"}:
                notes.append("Further rules apply to the input as a whole.")
    for key, rule in (("oneOf", "exactly one"), ("anyOf", "at least one")):
        branches = [b for b in out.pop(key, []) if isinstance(b, dict)]
        if not branches:
            continue
        groups = []
        for branch in branches:
            for name, sub in branch.get("properties", {}).items():
                properties.setdefault(name, sub)
            names = branch.get("required", [])
            groups.append(" and ".join(names) if names else "another form")
        notes.append(f"Give {rule} of: {'; '.join(groups)}.")
    dropped = [out.pop(key) for key in ("not", "enum") if key in out]
    if dropped:
        notes.append("Further rules apply to the input as a whole.")
    if required:
        out["required"] = required
    if notes:
        unique = list(dict.fromkeys(notes))
        description = " ".join([description.rstrip(), *unique]).strip()
    return out, description


def strict_schema(schema: dict[str, Any], dropped: set[str] | None = None) -> dict[str, Any]:
    """OpenAI strict-mode form: every property required, optional ones nullable, no extra
    properties, at every level, without the keywords of ``STRICT_DROPPED`` (their names are
    added to ``dropped``). Raises NotStrict naming the rule the schema breaks."""
    if "anyOf" in schema or schema.get("type") != "object":
        raise NotStrict("the root must be an object, not anyOf")
    converted = _strict_node(copy.deepcopy(schema), 1, dropped if dropped is not None else set())
    _check_strict_limits(converted)
    return converted  # type: ignore[no-any-return]


def _strict_node(node: Any, depth: int, dropped: set[str]) -> Any:
    if not isinstance(node, dict):
        raise NotStrict("every schema must be an object")
    if node.get("format") not in (None, *STRICT_STRING_FORMATS):
        dropped.add(f"format {node['format']!r}")
        node = {k: v for k, v in node.items() if k != "format"}
    unknown = sorted(set(node) - STRICT_KEYWORDS - STRICT_DROPPED)
    if unknown:
        raise NotStrict(f"strict mode does not support {', '.join(unknown)}")
    if depth > STRICT_MAX_DEPTH:
        raise NotStrict(f"strict mode allows {STRICT_MAX_DEPTH} levels of nesting")
    dropped.update(set(node) & STRICT_DROPPED)
    out = {k: v for k, v in node.items() if k != "$schema" and k not in STRICT_DROPPED}
    if "$defs" in out:
        out["$defs"] = {k: _strict_node(v, depth, dropped) for k, v in out["$defs"].items()}
    if "anyOf" in out:
        out["anyOf"] = [_strict_node(n, depth, dropped) for n in out["anyOf"]]
    kind = out.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" in kinds or "properties" in out:
        if out.get("additionalProperties") not in (None, False):
            raise NotStrict("objects may not allow additional properties")
        props = out.get("properties", {})
        required = set(out.get("required", []))
        out["properties"] = {
            name: (
                _strict_node(sub, depth + 1, dropped)
                if name in required
                else _nullable(_strict_node(sub, depth + 1, dropped))
            )
            for name, sub in props.items()
        }
        out["required"] = list(props)
        out["additionalProperties"] = False
    if "array" in kinds or "items" in out:
        if not isinstance(out.get("items"), dict):
            raise NotStrict("arrays need items in strict mode")
        out["items"] = _strict_node(out["items"], depth + 1, dropped)
    return out


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if "enum" in node or "const" in node or "$ref" in node or kind is None:
        return {"anyOf": [node, {"type": "null"}]}
    if isinstance(kind, list):
        return node if "null" in kind else {**node, "type": [*kind, "null"]}
    return {**node, "type": [kind, "null"]}


def _check_strict_limits(schema: dict[str, Any]) -> None:
    properties = enums = strings = 0
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("properties", "$defs"):
                if isinstance(node.get(key), dict):
                    properties += len(node[key]) if key == "properties" else 0
                    strings += sum(len(n) for n in node[key])
            if isinstance(node.get("enum"), list):
                enums += len(node["enum"])
                strings += sum(len(json.dumps(v)) for v in node["enum"])
            if "const" in node:
                strings += len(json.dumps(node["const"]))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if properties > STRICT_MAX_PROPERTIES:
        raise NotStrict(f"strict mode allows {STRICT_MAX_PROPERTIES} properties in all")
    if enums > STRICT_MAX_ENUM_VALUES:
        raise NotStrict(f"strict mode allows {STRICT_MAX_ENUM_VALUES} enum values in all")
    if strings > STRICT_MAX_STRING_TOTAL:
        raise NotStrict(f"strict mode allows {STRICT_MAX_STRING_TOTAL} characters of names")


def schema_warnings(schema: dict[str, Any], field: str = "input_schema") -> list[Problem]:
    """What the tool lists will do to this schema; empty when it is offered as is."""
    out = [
        problem(
            f"{field}.{key}",
            f"OpenAI and Anthropic refuse {key} at the top level of a tool's parameters: tool "
            "lists offer the schema without it (the rule moves to the description) and every "
            "call is still checked against the full schema",
        )
        for key in TOP_LEVEL_FORBIDDEN
        if key in schema
    ]
    dropped: set[str] = set()
    try:
        strict_schema(for_providers(schema, "")[0], dropped)
    except NotStrict as exc:
        out.append(problem(field, f"offered to OpenAI with strict: false, because {exc}"))
    else:
        if dropped:
            left_out = ", ".join(sorted(dropped))
            out.append(
                problem(
                    field,
                    f"offered to OpenAI with strict: true without {left_out} (strict mode "
                    "lacks them); every call is still checked against the full schema",
                )
            )
    return out


# How a custom tool is named in a list: ``custom_{id}`` (the default), or its own name where
# that fits every format's rule and is not a built-in's (docs/agents.md, "Tool names").
NAMES = ("id", "name")
_OWN_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def by_own_name(defs: list[ToolDef], is_builtin: Callable[[str], bool]) -> list[ToolDef]:
    """Each custom tool under its own name where it can be; else as it was (``custom_{id}``).
    The dispatch finds a tool by either (tests/api/test_tool_names.py)."""
    out = []
    for d in defs:
        own = d.tool_name
        if d.kind == "custom" and own and _OWN_NAME.fullmatch(own) and not is_builtin(own):
            d = dataclasses.replace(d, name=own)
        out.append(d)
    return out


def render(defs: list[ToolDef], fmt: str, strict: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in defs:
        schema, description = for_providers(d.input_schema, d.description)
        if fmt == "openai":
            fn: dict[str, Any] = {"name": d.name, "description": description, "parameters": schema}
            if strict:
                try:
                    fn["parameters"] = strict_schema(schema)
                    fn["strict"] = True
                except NotStrict:
                    fn["strict"] = False
            out.append({"type": "function", "function": fn})
        elif fmt == "anthropic":
            out.append({"name": d.name, "description": description, "input_schema": schema})
        else:
            out.append(
                {
                    "name": d.name,
                    "description": description,
                    "inputSchema": schema,
                    "annotations": {"openWorldHint": d.open_world},
                }
            )
    return out
