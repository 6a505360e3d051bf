"""A problem found while validating input: field, message and where in the code."""

from __future__ import annotations

import math
import re
from typing import Any, TypedDict

MAX_DEPTH = 64  # nesting a stored value may have


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


def bad_text(value: str) -> str | None:
    """Why a string cannot be stored or sent on as text, or None: NUL (PostgreSQL cannot
    store it) and lone surrogates (not Unicode: no UTF-8 encoding exists for them)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (no lone surrogates such as \\ud800)"
    return None


def text_problems(field: str, value: Any, depth: int = 0) -> list[Problem]:
    """The first value in ``value`` (keys included) that cannot be stored or sent on as
    JSON text, if any: a string with NUL or a lone surrogate, a number that is not finite,
    or nesting deeper than ``MAX_DEPTH`` (refused, never passed unchecked)."""
    if isinstance(value, str):
        why = bad_text(value)
        return [problem(field, why)] if why else []
    if isinstance(value, float) and not math.isfinite(value):
        return [problem(field, "must be a finite number (NaN and Infinity are not JSON)")]
    if depth > MAX_DEPTH and isinstance(value, dict | list):
        return [problem(field, f"must not nest deeper than {MAX_DEPTH} levels")]
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{field}.{k}" if isinstance(k, str) and bad_text(k) is None else field
            found = text_problems(field, k, depth + 1) or text_problems(sub, v, depth + 1)
            if found:
                return found
        return []
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = text_problems(f"{field}.{i}", v, depth + 1)
            if found:
                return found
    return []


def scrub(value: str) -> str:
    """Text from a sandbox made storable: NUL and lone surrogates become U+FFFD."""
    if bad_text(value) is None:
        return value
    return _UNSTORABLE.sub("\ufffd", value)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def scrub_all(value: Any) -> Any:
    """``value`` with every string in it (keys too) made storable as ``scrub`` does: for
    what repeats text from outside (a model's answer) in a response or an audit row."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_all(k): scrub_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_all(v) for v in value]
    return value


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
