"""Positions shown as opaque strings: audit row ids and list cursors.

Rows are ordered by sequences the whole service shares (``audit.id``, ``tools.seq``,
``outbox.seq``): every workspace's rows take numbers from them, so a number shown to a
client would count what other workspaces did between two of its own rows. What a client
sees instead is the position enciphered with a key only the service holds: AES-256 applied
to one 16-byte block (a keyed permutation of blocks, so equal positions give equal strings
and distinct ones distinct strings) that holds the position, the kind of string it is, and
seven zero bytes. Without the key the string is indistinguishable from 128 random bits: it
tells neither the position nor how far apart two strings are. With it, a string is opened
only if it deciphers to the kind expected and the zero bytes (one that was not issued, or
altered, passes with chance 2**-56), so a client can neither decode a cursor nor make one
up to probe where other workspaces' rows lie. The strings are 32 lowercase hexadecimal
digits (the 128 bits as they are: ``bytes.hex`` costs a fraction of a microsecond, where
base32 in Python cost ~15 us a row, half again the time of a 500-row audit page).

tests/security/test_opaque_ids.py checks that nothing a client is handed counts another
workspace's activity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

Kind = Literal["audit", "audit-cursor", "tools-cursor", "outbox-cursor"]
_TAGS: dict[Kind, int] = {"audit": 1, "audit-cursor": 2, "tools-cursor": 3, "outbox-cursor": 4}
KEY_BYTES = 32
BLOCK = 16
# A string this module issues: text.CURSOR_PATTERN.
OPAQUE_PATTERN = "^[0-9a-f]{32}$"
_OPAQUE = re.compile(OPAQUE_PATTERN)
_MAX_POSITION = 2**64 - 1


class Positions:
    """Seals positions into opaque strings and opens them again, with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the key is {KEY_BYTES} bytes")
        # One block at a time: ECB on a single block is the block cipher itself (a keyed
        # permutation); no two blocks of one message are ever related here.
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())  # noqa: S305

    def seal(self, kind: Kind, position: int) -> str:
        return self.seal_all(kind, [position])[0]

    def seal_all(self, kind: Kind, positions: Iterable[int]) -> list[str]:
        """Each position's string (one cipher pass for a whole page)."""
        plain = b"".join(_block(kind, p) for p in positions)
        if not plain:
            return []
        sealed = self._cipher.encryptor().update(plain)
        return [sealed[i : i + BLOCK].hex() for i in range(0, len(sealed), BLOCK)]

    def open(self, kind: Kind, text: str) -> int | None:
        """The position ``text`` holds, or None if it is not a ``kind`` this key sealed."""
        if not _OPAQUE.fullmatch(text):
            return None
        block = self._cipher.decryptor().update(bytes.fromhex(text))
        if block[8:] != _check(kind):
            return None
        return int.from_bytes(block[:8], "big")


def _check(kind: Kind) -> bytes:
    return bytes([_TAGS[kind]]) + bytes(7)


def _block(kind: Kind, position: int) -> bytes:
    if not 0 <= position <= _MAX_POSITION:
        raise ValueError("a position is a 64-bit unsigned integer")
    return position.to_bytes(8, "big") + _check(kind)
