"""Length-prefixed JSON frames: 4-byte big-endian length, then UTF-8 JSON. No pickle, ever.

The reader enforces a size cap before allocating and a deadline on every read.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
# Bound once, so tool code that monkeypatches the json module does not change our framing.
_dumps, _loads = json.dumps, json.loads


class FrameError(Exception):
    """The peer sent something that is not a frame within the rules."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "eof", "too_large", "garbage", "timeout"


def encode(obj: Any) -> bytes:
    body = _dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return HEADER.pack(len(body)) + body


def send(sock: socket.socket, obj: Any) -> None:
    sock.sendall(encode(obj))


class Reader:
    """Reads frames from one socket, keeping what arrived beyond the current frame.

    One ``recv`` of up to 64 KiB usually brings a whole frame, so a frame costs one poll and
    one read instead of two of each. Caps are checked before any body is accumulated."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self, need: int, deadline: float | None) -> None:
        while len(self.buf) < need:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FrameError("timeout", "deadline passed")
                ready, _, _ = select.select([self.sock], [], [], left)
                if not ready:
                    raise FrameError("timeout", "deadline passed")
            chunk = self.sock.recv(max(65536, min(need - len(self.buf), 1 << 20)))
            if not chunk:
                raise FrameError("eof", "the peer closed the channel")
            self.buf += chunk

    def recv(self, max_bytes: int, deadline: float | None = None) -> Any:
        self._fill(HEADER.size, deadline)
        (length,) = HEADER.unpack_from(self.buf)
        if length > max_bytes:
            raise FrameError("too_large", f"frame of {length} bytes is over the cap of {max_bytes}")
        self._fill(HEADER.size + length, deadline)
        body = bytes(self.buf[HEADER.size : HEADER.size + length])
        del self.buf[: HEADER.size + length]
        try:
            return _loads(body)
        except (ValueError, RecursionError) as exc:
            raise FrameError("garbage", f"not a JSON frame: {exc}") from None
