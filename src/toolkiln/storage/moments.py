"""Moments read from the database, as aware UTC datetimes whatever the driver gives."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
