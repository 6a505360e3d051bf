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


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameError("timeout", "deadline passed")
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                raise FrameError("timeout", "deadline passed")
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise FrameError("eof", "the peer closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, max_bytes: int, deadline: float | None = None) -> Any:
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    if length > max_bytes:
        raise FrameError("too_large", f"frame of {length} bytes is over the cap of {max_bytes}")
    body = _recv_exact(sock, length, deadline)
    try:
        return _loads(body)
    except (ValueError, RecursionError) as exc:
        raise FrameError("garbage", f"not a JSON frame: {exc}") from None
