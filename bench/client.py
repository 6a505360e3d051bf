"""A minimal HTTP/1.1 keep-alive client for the bench.

The machine has two cores; a full-featured client (httpx) spends ~0.3-0.5 ms of CPU per
request, which would be taken from the service it measures. This one writes the request
bytes itself and reads the answer back by its Content-Length, or by its chunks (an MCP
answer is an event stream): a few tens of microseconds.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any


def _request(
    method: str, path: str, body: Any, token: str | None, headers: dict[str, str] | None = None
) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    if token:
        head.append(f"Authorization: Bearer {token}")
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower().decode()] = value.strip().decode(errors="replace")
    return status, fields


class Conn:
    """One keep-alive connection (blocking)."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.token = token
        self.buf = b""

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A JSON request and its JSON answer."""
        status, _, raw = self.exchange(method, path, body)
        return status, json.loads(raw) if raw else None

    def exchange(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """A request with extra ``headers``; the answer's status, headers and body."""
        self.sock.sendall(_request(method, path, body, self.token, headers))
        status, fields = _parse_head(self._until(b"\r\n\r\n"))
        if fields.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int(self._until(b"\r\n").split(b";")[0], 16):
                parts.append(self._exactly(size))
                self._until(b"\r\n")
            self._until(b"\r\n")  # the last chunk's end (no trailers are sent)
            return status, fields, b"".join(parts)
        return status, fields, self._exactly(int(fields.get("content-length", "0")))

    def _until(self, mark: bytes) -> bytes:
        while mark not in self.buf:
            self._fill()
        got, _, self.buf = self.buf.partition(mark)
        return got

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        got, self.buf = self.buf[:n], self.buf[n:]
        return got

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the service closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


class AsyncConn:
    """One keep-alive connection on asyncio streams (answers with a Content-Length)."""

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
        status, fields = _parse_head(head[:-4])
        raw = await self.reader.readexactly(int(fields.get("content-length", "0")))
        return status, json.loads(raw) if raw else None

    def close(self) -> None:
        self.writer.close()
