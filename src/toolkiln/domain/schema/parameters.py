"""The seed's ``parameters`` map and JSON Schema 2020-12: the two-way conversion."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.problems import Problem, problem

DIALECT = "https://json-schema.org/draft/2020-12/schema"
JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def parameters_to_schema(parameters: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """``{"x": {"type": "string", "required": true}}`` -> an object schema with ``required``."""
    problems: list[Problem] = []
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in parameters.items():
        field = f"parameters.{name}"
        if not name or len(name) > 64:
            problems.append(problem(field, "parameter names must be 1 to 64 characters"))
            continue
        if not isinstance(spec, dict):
            problems.append(problem(field, 'must be an object such as {"type": "string"}'))
            continue
        spec = dict(spec)
        req = spec.pop("required", False)
        if not isinstance(req, bool):
            problems.append(problem(f"{field}.required", "must be true or false"))
        elif req:
            required.append(name)
        kind = spec.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is None or not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
            problems.append(
                problem(f"{field}.type", f"must be one of {', '.join(sorted(JSON_TYPES))}")
            )
        properties[name] = spec
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema, problems


def schema_to_parameters(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``parameters`` view of a schema, or None when the schema says more than it can hold."""
    if set(schema) - {"type", "properties", "required", "additionalProperties", "$schema"}:
        return None
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or not isinstance(properties, dict):
        return None
    required = set(schema.get("required", []))
    if not required <= set(properties):
        return None  # a required name with no property: the form cannot say it is needed
    out: dict[str, Any] = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict):
            return None
        out[name] = {**spec, "required": name in required}
    return out
