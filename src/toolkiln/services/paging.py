"""Opaque cursors over monotonically increasing sequence numbers."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TypeVar

from toolkiln.domain import limits
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import InvalidRequest
from toolkiln.domain.records import Page

T = TypeVar("T")


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"s{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("s"):
            raise ValueError(raw)
        return int(raw[1:])
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            "The cursor is not one this service issued.",
            [{"field": "cursor", "message": "invalid"}],
        ) from exc


def clamp_limit(limit: int | None) -> int:
    if limit is None:
        return limits.DEFAULT_PAGE_SIZE
    if not 1 <= limit <= limits.MAX_PAGE_SIZE:
        raise InvalidRequest(
            f"limit must be between 1 and {limits.MAX_PAGE_SIZE}.",
            [{"field": "limit", "message": f"must be between 1 and {limits.MAX_PAGE_SIZE}"}],
        )
    return limit


def listing_scope(principal: Principal, workspace_id: str | None) -> str | None:
    """The workspace a listing covers: the one asked for (if the caller may see it), else the
    caller's own; an admin without a filter sees every workspace (None)."""
    principal.require("read")
    if workspace_id is not None:
        principal.require_workspace(workspace_id)
        return workspace_id
    return None if principal.is_admin else principal.workspace_id


def page_of(rows: list[T], size: int, seq: Callable[[T], int]) -> Page[T]:
    """``rows`` were fetched with ``limit=size + 1``: one more row means one more page."""
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, encode_cursor(seq(rows[-1])) if more else None)
