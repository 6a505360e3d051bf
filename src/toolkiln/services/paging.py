"""Pages of a list, and their cursors: opaque strings over the rows' global order.

A cursor holds the position of the last row of a page in its table's own order (a sequence
every workspace shares), sealed by ``domain.opaque.Positions`` so that the client learns
nothing from it. Keyset paging on that column (``WHERE seq > :after ORDER BY
seq LIMIT n``, on an index that starts with the workspace) stays as cheap as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from toolkiln.domain import limits
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import InvalidRequest
from toolkiln.domain.opaque import Kind, Positions
from toolkiln.domain.records import Page

T = TypeVar("T")


def after(positions: Positions, kind: Kind, cursor: str | None) -> int:
    """The position a page starts after: 0 without a cursor. A cursor this service did not
    issue for this list is refused, naming the field (the OpenAPI pattern says only its
    shape: an opaque string cannot be told apart from one that was issued but by the key)."""
    if not cursor:
        return 0
    position = positions.open(kind, cursor)
    if position is None:
        raise InvalidRequest(
            "The cursor is not one this service issued for this list.",
            [{"field": "cursor", "message": "not a cursor of this list"}],
        )
    return position


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


def page_of(
    rows: list[T], size: int, seq: Callable[[T], int], positions: Positions, kind: Kind
) -> Page[T]:
    """``rows`` were fetched with ``limit=size + 1``: one more row means one more page."""
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, positions.seal(kind, seq(rows[-1])) if more else None)
