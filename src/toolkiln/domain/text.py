"""Which characters names and ids may hold: one pattern, used by the checks and the OpenAPI.

The checks and the document share these regular expressions, so a client generated from
``/openapi.json`` never sends a name the service then refuses (and the reverse). They are
written with ``\\uXXXX`` escapes only, which Python's ``re`` and ECMA-262 (JSON Schema's
pattern dialect) read alike.
"""

from __future__ import annotations

import re
import unicodedata

from toolkiln.domain.limits import MAX_CALL_ID_CHARS
from toolkiln.domain.opaque import OPAQUE_PATTERN

# Control, format, line and paragraph separator characters of the Basic Multilingual Plane:
# invisible or layout-changing characters that have no place in a name someone reads (bidi
# overrides, zero-width spaces, NUL). Lone surrogates are refused by
# ``problems.text_problems`` (a pattern naming them is one Schemathesis cannot use).
_HIDDEN = {"Cc", "Cf", "Zl", "Zp"}


def _hidden_class() -> str:
    ranges: list[tuple[int, int]] = []
    for cp in range(0x10000):
        if unicodedata.category(chr(cp)) in _HIDDEN:
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


HIDDEN_CHARS = _hidden_class()

# A label (workspace, token and agent names): no hidden characters, not blank, no white
# space at either end.
LABEL_PATTERN = f"^[^\\s{HIDDEN_CHARS}]([^{HIDDEN_CHARS}]*[^\\s{HIDDEN_CHARS}])?$"
# An id a client chooses (tool_call_id and the like): printable ASCII, spaces included.
CLIENT_ID_PATTERN = "^[\\u0020-\\u007e]+$"
# A free-text field: anything but NUL, which PostgreSQL cannot store.
NO_NUL_PATTERN = "^[^\\u0000]*$"
# The same, and not blank (code, a description to generate from).
NOT_BLANK_PATTERN = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
# A page cursor: the position of the last row seen, sealed (domain/opaque.py); the shape of
# every id here. Only one the service issued for that list is accepted.
CURSOR_PATTERN = OPAQUE_PATTERN
# Tool names.
TOOL_NAME_PATTERN = "^[a-z0-9]+(-[a-z0-9]+)*$"

_LABEL = re.compile(LABEL_PATTERN)
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)


def is_label(value: str) -> bool:
    return _LABEL.fullmatch(value) is not None


def is_client_id(value: str) -> bool:
    return 0 < len(value) <= MAX_CALL_ID_CHARS and _CLIENT_ID.fullmatch(value) is not None
