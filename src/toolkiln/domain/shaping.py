"""What a tool may show the user: the schemas of ``_render`` and ``_interactive`` (docs/ctx.md)."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.schema.validation import compile_validator, input_problems

_TEXT = {"type": "string", "maxLength": 100_000}
_URL = {"type": "string", "maxLength": 4096, "pattern": "^(https?://|/v1/files/)"}

RENDER_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"type": {"const": "markdown"}, "markdown": _TEXT},
            "required": ["type", "markdown"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "table"},
                "columns": {"type": "array", "items": {"type": "string"}, "maxItems": 50},
                "rows": {
                    "type": "array",
                    "items": {"type": "array", "maxItems": 50},
                    "maxItems": 1000,
                },
            },
            "required": ["type", "columns", "rows"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "image"}, "url": _URL, "alt": {"type": "string"}},
            "required": ["type", "url"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "file"},
                "url": _URL,
                "filename": {"type": "string", "maxLength": 255},
                "file_id": {"type": "string"},
            },
            "required": ["type", "url", "filename"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "json"}, "data": {}},
            "required": ["type", "data"],
            "additionalProperties": False,
        },
    ]
}

_ACTION = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "call_tool"},
                "tool": {"type": "string", "minLength": 1, "maxLength": 128},
                "input": {"type": "object"},
            },
            "required": ["type", "tool"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "message"}, "text": _TEXT},
            "required": ["type", "text"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"type": {"const": "open_url"}, "url": _URL},
            "required": ["type", "url"],
            "additionalProperties": False,
        },
    ]
}
_LABEL = {"type": "string", "minLength": 1, "maxLength": 80}

INTERACTIVE_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "buttons"},
                "prompt": _TEXT,
                "buttons": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10,
                    "items": {
                        "type": "object",
                        "properties": {"label": _LABEL, "action": _ACTION},
                        "required": ["label", "action"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["type", "buttons"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "form"},
                "prompt": _TEXT,
                "fields": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 30,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                            "label": _LABEL,
                            "type": {"enum": ["text", "number", "boolean", "select", "date"]},
                            "options": {"type": "array", "items": {"type": "string"}},
                            "required": {"type": "boolean"},
                        },
                        "required": ["name", "label", "type"],
                        "additionalProperties": False,
                    },
                },
                "submit": {
                    "type": "object",
                    "properties": {"label": _LABEL, "action": _ACTION},
                    "required": ["label", "action"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "fields", "submit"],
            "additionalProperties": False,
        },
    ]
}

_RENDER = compile_validator(RENDER_SCHEMA, None)  # the service's own patterns
_INTERACTIVE = compile_validator(INTERACTIVE_SCHEMA, None)


def shaping_problems(value: dict[str, Any]) -> list[dict[str, Any]]:
    """Problems of a result's ``_render`` / ``_interactive``; ``_llm`` must be a string."""
    out: list[dict[str, Any]] = []
    if "_llm" in value and not isinstance(value["_llm"], str):
        out.append({"field": "_llm", "message": "must be a string"})
    for key, validator in (("_render", _RENDER), ("_interactive", _INTERACTIVE)):
        if value.get(key) is not None:
            for p in input_problems(validator, value[key]):
                out.append(
                    {"field": key + p["field"].removeprefix("input"), "message": p["message"]}
                )
    return out
