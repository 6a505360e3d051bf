"""Opaque cursors over monotonically increasing sequence numbers."""

from __future__ import annotations

import base64

from toolkiln.domain import limits
from toolkiln.domain.errors import InvalidRequest


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
