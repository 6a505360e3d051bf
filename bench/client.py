"""A minimal HTTP/1.1 keep-alive client for the bench.

The machine has two cores; a full-featured client (httpx) spends ~0.3-0.5 ms of CPU per
request, which would be taken from the service it measures. This one writes the request
bytes itself and reads exactly Content-Length bytes back: a few tens of microseconds.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any


def _request(method: str, path: str, body: Any, token: str | None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    if token:
        head.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def _parse_head(head: bytes) -> tuple[int, int]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, length


class Conn:
    """One keep-alive connection (blocking)."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.token = token
        self.buf = b""

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self.sock.sendall(_request(method, path, body, self.token))
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status, length = _parse_head(head)
        while len(self.buf) < length:
            self._fill()
        raw, self.buf = self.buf[:length], self.buf[length:]
        return status, json.loads(raw) if raw else None

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the service closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


class AsyncConn:
    """One keep-alive connection on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str):
        self.reader, self.writer, self.token = reader, writer, token

    @classmethod
    async def open(cls, port: int, token: str) -> AsyncConn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, token)

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self.writer.write(_request(method, path, body, self.token))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status, length = _parse_head(head[:-4])
        raw = await self.reader.readexactly(length)
        return status, json.loads(raw) if raw else None

    def close(self) -> None:
        self.writer.close()
