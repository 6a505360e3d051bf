"""Opaque identifiers, tokens and timestamps."""

from __future__ import annotations

import base64
import hashlib
import secrets
from datetime import UTC, datetime

TOKEN_PREFIX = "tk_"  # noqa: S105 - a prefix, not a secret


def new_id() -> str:
    """A 26-character lowercase base32 id with 128 bits of randomness."""
    return base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def new_token_secret() -> str:
    """A bearer token value: shown once, stored only as a hash."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(value: str) -> str:
    """Tokens are high-entropy, so one SHA-256 is enough to make the stored hash useless."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def utcnow() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
