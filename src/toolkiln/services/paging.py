"""Opaque cursors over monotonically increasing sequence numbers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from toolkiln.domain import limits
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import InvalidRequest
from toolkiln.domain.records import Page
from toolkiln.domain.text import CURSOR_PATTERN

T = TypeVar("T")
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(seq: int) -> str:
    return f"{seq:x}"


def decode_cursor(cursor: str | None) -> int:
    """Every string of ``text.CURSOR_PATTERN`` is a cursor (the OpenAPI document says so)."""
    if not cursor:
        return 0
    if not _CURSOR.fullmatch(cursor):
        raise InvalidRequest(
            "The cursor is not one this service issued.",
            [{"field": "cursor", "message": "invalid"}],
        )
    return int(cursor, 16)


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
