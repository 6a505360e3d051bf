"""Secret values sealed at rest: AES-256-GCM (``cryptography``'s AEAD) under a key ring.

A ring is a list of 32-byte keys, newest first: the newest seals, any of them opens (each
sealed value names its key by a fingerprint). Rotating is adding a new key in front, then
re-saving each secret (or leaving values sealed under the old key, which must then stay in
the ring). The context a value is sealed with (its workspace and name) is the AEAD's
associated data, so a sealed value copied into another row does not open. docs/egress.md.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from toolkiln.domain.errors import ServiceUnavailable

KEY_BYTES = 32
_FORMAT = "v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_key(text: str) -> bytes:
    """A key as written in settings: 32 bytes in URL-safe base64 (``new_key()`` makes one)."""
    try:
        key = _unb64(text.strip())
    except ValueError:
        raise ValueError("a key is 32 bytes in URL-safe base64") from None
    if len(key) != KEY_BYTES:
        raise ValueError("a key is 32 bytes in URL-safe base64")
    return key


def new_key() -> str:
    return _b64(secrets.token_bytes(KEY_BYTES))


class KeyRing:
    """Seals with the first key, opens with whichever key sealed."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("a key ring needs a key")
        self._keys = {self._id(k): AESGCM(k) for k in keys}
        self._newest = self._id(keys[0])

    @staticmethod
    def _id(key: bytes) -> str:
        return hashlib.sha256(b"toolkiln secrets key " + key).hexdigest()[:12]

    def seal(self, plain: str, context: str) -> str:
        nonce = os.urandom(12)
        sealed = self._keys[self._newest].encrypt(nonce, plain.encode(), context.encode())
        return f"{_FORMAT}.{self._newest}.{_b64(nonce + sealed)}"

    def open(self, sealed: str, context: str) -> str:
        try:
            version, key_id, body = sealed.split(".")
            aead = self._keys[key_id] if version == _FORMAT else None
            if aead is None:
                raise KeyError(key_id)
            raw = _unb64(body)
            return aead.decrypt(raw[:12], raw[12:], context.encode()).decode()
        except (KeyError, ValueError, InvalidTag):
            raise ServiceUnavailable(
                "A secret could not be opened with the configured keys "
                "(TOOLKILN_SECRETS_KEYS, docs/egress.md).",
                code="secret_unreadable",
            ) from None


def ring_for(configured: list[str], data_dir: Path) -> KeyRing:
    """The configured keys, else one generated once into ``data_dir/secrets.key`` (readable
    by the service's user only) and kept: a single service works with nothing set; several
    replicas must share keys through the setting (docs/configuration.md)."""
    if configured:
        return KeyRing([parse_key(k) for k in configured])
    path = data_dir / "secrets.key"
    if not path.exists():  # written whole, then linked in: a racing start reads one key
        draft = data_dir / f".secrets.key.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(new_key() + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return KeyRing([parse_key(path.read_text())])
