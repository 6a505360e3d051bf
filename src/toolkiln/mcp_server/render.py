"""How a failed Result reads to an MCP client's model: the code, the message, and each field
the details name, so the model can correct its arguments."""

from __future__ import annotations

from typing import Any

MAX_FIELDS = 10


def error_text(error: dict[str, Any]) -> str:
    """``invalid_input: The input does not match the schema. order_id: 'order_id' is a
    required property``: one line, the problems' fields named."""
    text = f"{error.get('code')}: {error.get('message')}"
    details = error.get("details")
    problems = details if isinstance(details, list) else [details]
    named = [
        f"{p['field']}: {p.get('message', 'invalid')}"
        for p in problems
        if isinstance(p, dict) and isinstance(p.get("field"), str)
    ]
    if named:
        text += " " + "; ".join(named[:MAX_FIELDS])
    return text
