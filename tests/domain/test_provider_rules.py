"""Every tool-list format checked against the rules the providers publish, written down here
as data (with where each rule is documented), not only against JSON Schema validity.

The rules are checked independently of ``toolkiln.domain.formats``: this file does not import
its constants, so a rule relaxed there still fails here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from toolkiln.builtins.calculate import Calculate
from toolkiln.builtins.email import SendEmail
from toolkiln.builtins.files import SurfaceFile
from toolkiln.builtins.http import SPEC as HTTP_SPEC
from toolkiln.builtins.search import WebSearch
from toolkiln.domain.builtin import RUN_CODE_SPEC
from toolkiln.domain.codemode import RUN_PROGRAM_SPEC
from toolkiln.domain.formats import ToolDef, render, schema_warnings

COMBINATORS = {"oneOf", "anyOf", "allOf", "not", "enum"}

# OpenAI, function calling (https://platform.openai.com/docs/guides/function-calling and the
# Chat Completions reference, `tools[].function`): the name is a-z, A-Z, 0-9, underscores and
# dashes, at most 64 characters; `parameters` is a JSON Schema object. A schema with oneOf,
# anyOf, allOf, not or enum at its top level is refused ("schema must be a JSON Schema of
# 'type: \"object\"'" / "'oneOf' is not permitted").
OPENAI = {
    "name": r"^[a-zA-Z0-9_-]{1,64}$",
    "entry_keys": {"type", "function"},
    "function_keys": {"name", "description", "parameters", "strict"},
    "schema_key": "parameters",
    "root_type": "object",
    "root_forbidden": COMBINATORS,
}
# OpenAI Structured Outputs, "Supported schemas"
# (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas), which
# `strict: true` on a function applies to its parameters.
OPENAI_STRICT = {
    "keywords": {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const",
        "anyOf", "description", "title", "$defs", "$ref",
        "pattern", "format",
        "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "minItems", "maxItems",
    },
    "types": {"string", "number", "boolean", "integer", "object", "array", "null"},
    "string_formats": {
        "date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
    },
    "root_may_be_anyOf": False,
    "all_properties_required": True,
    "additional_properties": False,
    "max_nesting": 10,
    "max_properties": 5000,
    "max_enum_values": 1000,
}  # fmt: skip
# Anthropic, tool use (https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/
# implement-tool-use, "Specifying client tools"): `name` must match ^[a-zA-Z0-9_-]{1,64}$,
# `input_schema` is a JSON Schema object; oneOf, allOf and anyOf are not supported at its top
# level (nor, as for OpenAI, enum or not: the root must be a plain object schema).
ANTHROPIC = {
    "name": r"^[a-zA-Z0-9_-]{1,64}$",
    "entry_keys": {"name", "description", "input_schema"},
    "schema_key": "input_schema",
    "root_type": "object",
    "root_forbidden": COMBINATORS,
}
# MCP, server tools (https://modelcontextprotocol.io/specification/2025-11-25/server/tools):
# `inputSchema` is a JSON Schema object (`"type": "object"`); tool names SHOULD be 1-128
# characters of A-Z, a-z, 0-9, `_`, `-` and `.`. MCP clients hand the schema on to model
# providers, so the providers' top-level rule applies too. `annotations` holds the tool's
# hints; `openWorldHint` says whether it may reach the network.
MCP = {
    "name": r"^[A-Za-z0-9_.-]{1,128}$",
    "entry_keys": {"name", "description", "inputSchema", "annotations"},
    "schema_key": "inputSchema",
    "root_type": "object",
    "root_forbidden": COMBINATORS,
}
RULES = {"openai": OPENAI, "anthropic": ANTHROPIC, "mcp": MCP}

BUILTINS = [
    Calculate.spec,
    SendEmail.spec,
    WebSearch.spec,
    SurfaceFile.spec,
    HTTP_SPEC,
    RUN_CODE_SPEC,
    RUN_PROGRAM_SPEC,
]

# Schemas a user may save (all valid JSON Schema 2020-12 with an object root).
SCHEMAS: dict[str, dict[str, Any]] = {
    "plain": {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "query"}},
        "required": ["q"],
    },
    "top_one_of": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        "additionalProperties": False,
    },
    "top_any_of_with_properties": {
        "type": "object",
        "anyOf": [
            {"properties": {"email": {"type": "string"}}, "required": ["email"]},
            {"properties": {"phone": {"type": "string"}}, "required": ["phone"]},
        ],
    },
    "top_all_of": {
        "type": "object",
        "allOf": [
            {"properties": {"x": {"type": "number"}}, "required": ["x"]},
            {"properties": {"y": {"type": "number"}}},
        ],
    },
    "top_not_and_enum": {
        "type": "object",
        "properties": {"k": {"type": "string"}},
        "not": {"required": ["forbidden"]},
        "enum": [{"k": "a"}, {"k": "b"}],
    },
    "nested_combinators_are_fine": {
        "type": "object",
        "properties": {
            "to": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "unit": {"enum": ["c", "f"]},
        },
    },
    "strict_able_with_defs": {
        "type": "object",
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "properties": {
            "at": {"$ref": "#/$defs/point"},
            "when": {"type": "string", "format": "date-time"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        },
        "required": ["at"],
    },
    "strict_without_min_length": {
        "type": "object",
        "properties": {"q": {"type": "string", "minLength": 2, "default": "ab"}},
    },
    "not_strict_pattern_properties": {
        "type": "object",
        "patternProperties": {"^x-": {"type": "string"}},
    },
    "not_strict_open_object": {
        "type": "object",
        "properties": {"meta": {"type": "object", "additionalProperties": {"type": "string"}}},
    },
    "strict_without_format_uri": {
        "type": "object",
        "properties": {"site": {"type": "string", "format": "uri"}},
    },
    "not_strict_array_without_items": {"type": "object", "properties": {"xs": {"type": "array"}}},
    "not_strict_too_deep": {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}}},
    },
    "empty": {"type": "object", "properties": {}, "additionalProperties": False},
}
node = SCHEMAS["not_strict_too_deep"]["properties"]["a"]
for _ in range(12):
    node["properties"]["a"] = {"type": "object", "properties": {}}
    node = node["properties"]["a"]


def defs() -> list[ToolDef]:
    out = [ToolDef(s.name, s.description, s.input_schema, "builtin") for s in BUILTINS]
    out += [
        ToolDef(f"custom_{i:026d}", f"tool {name}", schema, "custom", str(i), 1)
        for i, (name, schema) in enumerate(SCHEMAS.items())
    ]
    return out


def check_entry(fmt: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The provider's rules for one entry; returns its parameters schema."""
    rules = RULES[fmt]
    if fmt == "openai":
        assert set(entry) == rules["entry_keys"] and entry["type"] == "function"
        spec = entry["function"]
        assert set(spec) <= rules["function_keys"]
    else:
        spec = entry
        assert set(spec) == rules["entry_keys"]
    assert re.fullmatch(rules["name"], spec["name"]), spec["name"]
    assert isinstance(spec["description"], str) and spec["description"]
    schema = spec[rules["schema_key"]]
    assert schema.get("type") == rules["root_type"], spec["name"]
    assert not set(schema) & rules["root_forbidden"], (spec["name"], set(schema))
    assert "$schema" not in schema
    Draft202012Validator.check_schema(schema)
    if fmt == "mcp":
        assert set(spec["annotations"]) == {"openWorldHint"}
        assert isinstance(spec["annotations"]["openWorldHint"], bool)
    return schema


def check_strict(schema: dict[str, Any]) -> None:
    """OpenAI's strict rules at every level of the schema."""
    rules = OPENAI_STRICT
    assert "anyOf" not in schema or rules["root_may_be_anyOf"]
    counts = {"properties": 0, "enum": 0}

    def walk(node: Any, depth: int) -> None:
        assert isinstance(node, dict)
        assert set(node) <= rules["keywords"], set(node) - rules["keywords"]
        assert depth <= rules["max_nesting"]
        kinds = node.get("type")
        for kind in kinds if isinstance(kinds, list) else [kinds] if kinds else []:
            assert kind in rules["types"]
        if "format" in node:
            assert node["format"] in rules["string_formats"]
        counts["enum"] += len(node.get("enum", []))
        for sub in node.get("$defs", {}).values():
            walk(sub, depth)
        for sub in node.get("anyOf", []):
            walk(sub, depth)
        if "properties" in node or node.get("type") == "object":
            props = node.get("properties", {})
            counts["properties"] += len(props)
            assert node.get("additionalProperties") is rules["additional_properties"]
            if rules["all_properties_required"]:
                assert sorted(node.get("required", [])) == sorted(props)
            for sub in props.values():
                walk(sub, depth + 1)
        if "array" in (kinds if isinstance(kinds, list) else [kinds]):
            assert isinstance(node.get("items"), dict)
        if "items" in node:
            walk(node["items"], depth + 1)

    walk(schema, 1)
    assert counts["properties"] <= rules["max_properties"]
    assert counts["enum"] <= rules["max_enum_values"]


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_every_entry_of_every_format_follows_the_providers_rules(fmt: str) -> None:
    for entry in render(defs(), fmt):
        check_entry(fmt, entry)


def test_built_in_schemas_themselves_have_no_top_level_combinators() -> None:
    for spec in BUILTINS:
        assert spec.input_schema["type"] == "object"
        assert not set(spec.input_schema) & COMBINATORS, spec.name


def test_strict_true_only_where_openais_strict_rules_hold() -> None:
    entries = {e["function"]["name"]: e["function"] for e in render(defs(), "openai", True)}
    strict = {n for n, f in entries.items() if f["strict"]}
    for name in strict:
        check_entry("openai", {"type": "function", "function": entries[name]})
        check_strict(entries[name]["parameters"])
    label_of = {f"custom_{i:026d}": label for i, label in enumerate(SCHEMAS)}
    strict_labels = {label_of[n] for n in strict if n in label_of}
    assert {
        "plain",
        "strict_able_with_defs",
        "empty",
        "top_one_of",
        "top_all_of",
        "strict_without_min_length",
        "strict_without_format_uri",
    } <= strict_labels
    assert not {label for label in strict_labels if label.startswith("not_strict")}
    # http_request's headers (a map of any names) and json body (any value) have no form in
    # OpenAI's strict mode: it is offered with strict: false.
    open_ended = {"http_request"}
    assert {s.name for s in BUILTINS} - open_ended == {
        n for n in strict if not n.startswith("custom_")
    }


def test_an_adapted_schema_accepts_everything_the_stored_one_does() -> None:
    samples = [
        {},
        {"a": "x"},
        {"b": 3},
        {"a": "x", "b": 3},
        {"email": "e"},
        {"phone": "p"},
        {"x": 1, "y": 2},
        {"k": "a"},
        {"q": "hello"},
    ]
    for d in defs():
        (entry,) = render([d], "anthropic")
        adapted = Draft202012Validator(entry["input_schema"])
        stored = Draft202012Validator(d.input_schema)
        for sample in samples:
            if stored.is_valid(sample):
                assert adapted.is_valid(sample), (d.name, sample)


def test_the_rule_that_left_the_schema_is_in_the_description() -> None:
    (entry,) = render([ToolDef("t", "Pick one.", SCHEMAS["top_one_of"], "custom")], "mcp")
    assert entry["description"] == "Pick one. Give exactly one of: a; b."
    (entry,) = render(
        [ToolDef("t", "Reach me.", SCHEMAS["top_any_of_with_properties"], "x")], "mcp"
    )
    assert entry["description"] == "Reach me. Give at least one of: email; phone."
    assert set(entry["inputSchema"]["properties"]) == {"email", "phone"}
    (entry,) = render([ToolDef("t", "Add.", SCHEMAS["top_all_of"], "custom")], "mcp")
    assert entry["inputSchema"]["required"] == ["x"] and entry["description"] == "Add."


def test_warnings_say_what_the_lists_will_do() -> None:
    assert schema_warnings(SCHEMAS["plain"]) == []
    fields = [w["field"] for w in schema_warnings(SCHEMAS["top_not_and_enum"])]
    assert fields == ["input_schema.not", "input_schema.enum"]
    (strict,) = schema_warnings(SCHEMAS["strict_without_min_length"])
    assert strict["field"] == "input_schema" and "without default, minLength" in strict["message"]
    (lax,) = schema_warnings(SCHEMAS["not_strict_pattern_properties"])
    assert "strict: false" in lax["message"] and "patternProperties" in lax["message"]
