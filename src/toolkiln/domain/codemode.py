"""Code mode: an agent's tools offered as one ``run_program`` tool whose
description declares each of them as a typed signature in the program's language.

Signatures are generated from the same ``ToolDef`` list the direct tool list is rendered
from, so what a program can reach and what a model is told agree by construction.
"""

from __future__ import annotations

import json
import re
from typing import Any

from toolkiln.domain.builtin import RUN_CODE_SPEC, BuiltinSpec
from toolkiln.domain.formats import CUSTOM_PREFIX, ToolDef
from toolkiln.domain.limits import MAX_TIMEOUT_MS
from toolkiln.domain.records import BUILTIN_NAMES

RUN_PROGRAM = "run_program"
PROGRAM_TIMEOUT_MS = 30000
PROGRAM_LANGUAGES = ("python", "javascript")
RUN_PROGRAM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "enum": list(PROGRAM_LANGUAGES)},
        "code": {"type": "string", "minLength": 1, "maxLength": 262144},
        "timeout_ms": {"type": "integer", "minimum": 100, "maximum": MAX_TIMEOUT_MS},
    },
    "required": ["language", "code"],
    "additionalProperties": False,
}
RUN_CODE_NAME = RUN_CODE_SPEC.name
_IDENT = re.compile(r"[^a-zA-Z0-9_]")
_MAX_DOC = 300  # characters of a tool's or a field's description kept in a signature


def call_name(d: ToolDef) -> str:
    """What a program writes after ``ctx.tools.``: built-ins by name, custom tools by their
    name with ``_`` for ``-`` (custom tool names are kebab-case, so this is one-to-one),
    unless that name means something else to the router: a built-in's name (a custom tool
    ``send-email`` would be listed as ``send_email`` and reach the built-in) or the
    ``custom_`` prefix of ids; such a tool is listed by its id, ``custom_{id}``."""
    if d.kind == "custom" and d.tool_name:
        name = d.tool_name.replace("-", "_")
        if name not in BUILTIN_NAMES and not name.startswith(CUSTOM_PREFIX):
            return name
    return d.name


def describe(defs: list[ToolDef], language: str) -> str:
    """The ``run_program`` description: how to write the program, then every tool."""
    if language == "javascript":
        head = (
            "Run one JavaScript program that calls this agent's tools. Define "
            "`async function handle(input, ctx)`; `input` is {}. Call a tool with "
            "`await ctx.tools.NAME(args)`; it resolves to the tool's result, or to "
            "`{error, details}` when the call fails (check `result.error`). Return any JSON "
            "value (or `{message, rawData}`): that is what you get back. At most 50 tool "
            "calls per program. Tools:\n"
        )
        body = [RESULT_NOTE[language], *(_ts(d, call_name(d)) for d in defs)]
    else:
        head = (
            "Run one Python program that calls this agent's tools. Define "
            "`async def handle(input, ctx)`; `input` is {}. Call a tool with "
            "`await ctx.tools.NAME({...})`; it returns the tool's result as a dict, or "
            '`{"error": code, "details": ...}` when the call fails. Return any JSON value '
            '(or {"message", "rawData"}): that is what you get back. At most 50 tool calls '
            "per program. Tools:\n"
        )
        body = [RESULT_NOTE[language], *(_py(d, call_name(d)) for d in defs)]
    return head + "\n".join(body)


def program_allowed(builtins: list[str] | frozenset[str]) -> bool:
    """``run_program`` runs code the caller wrote, as ``run_code`` does: the workspace
    policy's ``run_code`` decides both, in the tool list and when called (a policy of
    ``builtins: []`` left programs running: tests/security/test_program_policy.py)."""
    return RUN_CODE_NAME in builtins


RUN_PROGRAM_SPEC = BuiltinSpec(
    RUN_PROGRAM, "Run one program over the agent's tools (code mode).", RUN_PROGRAM_SCHEMA
)


def program_def(defs: list[ToolDef], language: str) -> ToolDef:
    """``run_program`` as an agent is offered it: the spec's schema, its language's default,
    and the description that declares ``defs``."""
    schema = json.loads(json.dumps(RUN_PROGRAM_SPEC.input_schema))
    schema["properties"]["language"]["default"] = language
    reaches = any(d.open_world for d in defs)
    return ToolDef(
        RUN_PROGRAM_SPEC.name, describe(defs, language), schema, "program", open_world=reaches
    )


# -- Python


def _py(d: ToolDef, name: str) -> str:
    schema = d.input_schema
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    classes: list[str] = []
    params = []
    for key in props:
        kind = _py_type(props[key], f"{_class_name(name)}_{key}", classes)
        params.append(f"{key}: {kind}" if key in required else f"{key}: {kind} = ...")
    returns = "dict" if d.kind != "custom" else "ToolResult"
    doc = [_clip(d.description)] + [
        f"{k}: {_clip(v.get('description', ''))}" for k, v in props.items() if v.get("description")
    ]
    star = "*, " if params else ""
    sig = f"def {name}({star}{', '.join(params)}) -> {returns}:  # ctx.tools.{name}({{...}})"
    body = '    """' + "\n    ".join(line for line in doc if line) + '"""'
    return "\n".join([*classes, sig, body])


def _py_type(node: Any, hint: str, classes: list[str]) -> str:
    if not isinstance(node, dict):
        return "Any"
    if "enum" in node:
        return f"Literal[{', '.join(json.dumps(v) for v in node['enum'][:20])}]"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " | ".join(_py_type(n, hint, classes) for n in node[key][:8])
    kind = node.get("type")
    if isinstance(kind, list):
        return " | ".join(_py_type({**node, "type": k}, hint, classes) for k in kind)
    if kind == "object" and node.get("properties"):
        cls = _class_name(hint)
        required = set(node.get("required") or [])
        fields = [
            f"    {k}: {_py_type(v, f'{hint}_{k}', classes)}"
            + ("" if k in required else "  # optional")
            for k, v in node["properties"].items()
        ]
        classes.append(f"class {cls}(TypedDict):\n" + "\n".join(fields))
        return cls
    if kind == "array":
        return f"list[{_py_type(node.get('items', {}), hint, classes)}]"
    return {
        "string": "str",
        "integer": "int",
        "number": "float",
        "boolean": "bool",
        "null": "None",
        "object": "dict",
    }.get(str(kind), "Any")


def _class_name(hint: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in _IDENT.sub("_", hint).split("_") if p)


# -- TypeScript-like declarations for JavaScript


def _ts(d: ToolDef, name: str) -> str:
    returns = "Promise<ToolResult>" if d.kind == "custom" else "Promise<any>"
    return (
        f"/** {_clip(d.description)} */\n"
        f"declare function {name}(args: {_ts_type(d.input_schema, 0)}): {returns};"
        f"  // ctx.tools.{name}(args)"
    )


def _ts_type(node: Any, depth: int) -> str:
    if not isinstance(node, dict) or depth > 6:
        return "any"
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"][:20])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " | ".join(_ts_type(n, depth + 1) for n in node[key][:8])
    kind = node.get("type")
    if isinstance(kind, list):
        return " | ".join(_ts_type({**node, "type": k}, depth) for k in kind)
    # Only an object (named, or a node without a type) declares its properties: each of a
    # type list's types declared them again, 7**depth times for a list of all seven
    # (tests/security/test_code_mode_declarations.py).
    if kind == "object" or (kind is None and "properties" in node):
        props = node.get("properties") or {}
        if not props:
            return "Record<string, any>"
        required = set(node.get("required") or [])
        parts = []
        for k, v in props.items():
            note = f"/** {_clip(v['description'])} */ " if v.get("description") else ""
            opt = "" if k in required else "?"
            parts.append(
                f"{note}{json.dumps(k) if _IDENT.search(k) else k}{opt}: {_ts_type(v, depth + 1)}"
            )
        return "{ " + "; ".join(parts) + " }"
    if kind == "array":
        return f"Array<{_ts_type(node.get('items', {}), depth + 1)}>"
    return {
        "string": "string",
        "integer": "number",
        "number": "number",
        "boolean": "boolean",
        "null": "null",
    }.get(str(kind), "any")


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_DOC else text[: _MAX_DOC - 1] + "…"


RESULT_NOTE = {  # what a custom tool's call resolves to
    "python": 'ToolResult = {"message": str, "rawData": Any, "llm": str, "tool_call_id": str}',
    "javascript": (
        "type ToolResult = { message: string; rawData: any; llm: string; tool_call_id: string };"
    ),
}
