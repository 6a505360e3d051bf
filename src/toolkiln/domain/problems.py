"""A problem found while validating input: field, message and where in the code."""

from __future__ import annotations

from typing import Any, TypedDict


class Problem(TypedDict, total=False):
    field: str
    message: str
    line: int
    column: int


def problem(
    field: str, message: str, line: int | None = None, column: int | None = None
) -> Problem:
    p: Problem = {"field": field, "message": message}
    if line is not None:
        p["line"] = line
    if column is not None:
        p["column"] = column
    return p


def nul_problems(field: str, value: Any, depth: int = 0) -> list[Problem]:
    """NUL characters cannot be stored by PostgreSQL and have no business in a tool."""
    if isinstance(value, str):
        return [problem(field, "must not contain NUL characters")] if "\x00" in value else []
    if depth > 64:
        return []
    if isinstance(value, dict):
        out: list[Problem] = []
        for k, v in value.items():
            out += nul_problems(field, k, depth + 1) + nul_problems(field, v, depth + 1)
        return out[:1]
    if isinstance(value, list):
        out = []
        for v in value:
            out += nul_problems(field, v, depth + 1)
        return out[:1]
    return []


def json_depth(value: Any) -> int:
    """Nesting depth without recursion, so hostile input cannot blow the stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest
