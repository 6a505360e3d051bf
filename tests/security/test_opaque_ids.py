"""Class: ids and cursors must not count another workspace's activity (CONTRACT 2).

Audit row ids and the cursors of the tool, audit and outbox lists were numbers of sequences
every workspace shares: between two of workspace A's invocations the gap in A's audit ids
was exactly the number of rows B's calls, edits and disables wrote, and A could make up
cursors to find where its own rows lay among everyone's. Here workspace B is busy (calls,
edits, a disable, emails, files, an agent, a token) between two rounds of A's own activity,
and then every id and cursor A is handed is checked, kind by kind:

- its shape is that of a random id, busy or not (ids the service makes: 26 base32
  characters; audit row ids and cursors: 32 hexadecimal digits; MCP session ids: a UUID4);
- read as a number every way a counter could be written (decimal, hexadecimal, base 32,
  base 36), two of A's consecutive values are as far apart as random 128-bit values are,
  never a small step a counter would make;
- a cursor A did not get from the service, made from one it got by any such arithmetic or
  by flipping a character, is refused: A cannot decode a cursor nor probe positions.
"""

from __future__ import annotations

import base64
import itertools
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import serving
from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant
from toolkiln.app import build
from toolkiln.config import Settings

RANDOM_ID = re.compile("^[a-z2-7]{26}$")
SEALED = re.compile("^[0-9a-f]{32}$")  # a sealed position (domain/opaque.py)
FAR = 2**64  # two random 128-bit values are closer than this with chance 2**-63
TOOL = "def main(**params):\n    return {'message': 'ok'}\n"
MAILER = (
    "async def handle(input, ctx):\n"
    "    sent = await ctx.tools.send_email({'to': ['x@example.org'], 'subject': 's',"
    " 'body_text': 'b'})\n"
    "    stored = await ctx.tools.surface_file({'filename': 'f.txt', 'content': 'c'})\n"
    "    return {'message': 'ok', 'rawData': {'sent': sent, 'file': stored}}\n"
)
_names = itertools.count()


@dataclass
class Seen:
    """Every id and cursor of one kind that A was handed, in the order it got them."""

    values: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, value: str | None) -> None:
        assert value is not None, kind
        self.values.setdefault(kind, []).append(value)


def _policy(t: Tenant) -> None:
    r = t.client.patch(
        f"/v1/workspaces/{t.workspace_id}/policy",
        json={"email_allowlist": ["example.org"]},
        headers=t.headers,
    )
    assert r.status_code == 200, r.text


def _mail_and_file(t: Tenant, tool_id: str) -> dict[str, Any]:
    result = t.invoke(tool_id)
    assert result["status"] == "ok", result
    return dict(result["raw_data"])


def _busy(b: Tenant, mailer: str) -> None:
    """B's activity: rows in every shared sequence (audit, tools, outbox) and more ids."""
    tool = b.tool(f"b-busy-{next(_names)}", TOOL, language="python")
    for _ in range(3):
        b.invoke(tool)
    _mail_and_file(b, mailer)
    b.client.patch(f"/v1/custom-tools/{tool}", json={"description": "edited"}, headers=b.headers)
    b.client.post(f"/v1/custom-tools/{tool}/disable", json={}, headers=b.headers)
    b.client.post(
        "/v1/agents", json={"workspace_id": b.workspace_id, "name": "b"}, headers=b.headers
    )


def _round(a: Tenant, mailer: str, seen: Seen) -> None:
    """One round of A's own activity, and the ids it is handed for it."""
    tool = a.tool(f"a-round-{next(_names)}", TOOL, language="python")
    seen.add("tool id", tool)
    seen.add("tool_call id", a.invoke(tool)["tool_call_id"])
    raw = _mail_and_file(a, mailer)
    seen.add("file id", raw["file"]["file_id"])
    seen.add("email message_id", raw["sent"]["message_id"].strip("<>").split("@")[0])
    agent = a.client.post(
        "/v1/agents", json={"workspace_id": a.workspace_id, "name": "a"}, headers=a.headers
    )
    seen.add("agent id", agent.json()["data"]["id"])


def _pages(a: Tenant, path: str, kind: str, seen: Seen, row_kind: str | None = None) -> None:
    """Every page of one of A's lists, one row a page: each page's cursor (and row ids)."""
    cursor: str | None = None
    while True:
        params = {"workspace_id": a.workspace_id, "limit": 1}
        if cursor:
            params["cursor"] = cursor
        r = a.client.get(path, params=params, headers=a.headers)
        assert r.status_code == 200, r.text
        if row_kind is not None:
            for row in r.json()["data"]:
                seen.add(row_kind, row["id"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return
        seen.add(kind, cursor)


def _readings(value: str) -> dict[str, int]:
    """``value`` read as a number every way a counter could be written."""
    out = {}
    for base in (10, 16, 36):
        try:
            out[f"base {base}"] = int(value, base)
        except ValueError:
            pass
    if re.fullmatch("[a-z2-7]+", value):
        padded = value.upper() + "=" * (-len(value) % 8)
        try:
            out["base32"] = int.from_bytes(base64.b32decode(padded), "big")
        except ValueError:
            pass
    return out


@dataclass
class Scene:
    a: Tenant
    seen: Seen
    lists: dict[str, str]  # cursor kind -> list path


@pytest.fixture(scope="module")
def scene(target: Target) -> Iterator[Scene]:
    rt, client = target.runtime, target.client
    a, b = tenant(rt, client, "opaque-a"), tenant(rt, client, "opaque-b")
    for t in (a, b):
        _policy(t)
    a_mailer = a.tool("a-mailer", MAILER, language="python")
    b_mailer = b.tool("b-mailer", MAILER, language="python")
    seen = Seen()
    for _ in range(3):  # A, B busy, A, B busy, A
        _round(a, a_mailer, seen)
        _busy(b, b_mailer)
        seen.add("token id", _token(target, a))
    _round(a, a_mailer, seen)
    lists = {
        "tools cursor": "/v1/custom-tools",
        "audit cursor": "/v1/audit",
        "outbox cursor": "/v1/outbox",
    }
    _pages(a, "/v1/custom-tools", "tools cursor", seen)
    _pages(a, "/v1/audit", "audit cursor", seen, row_kind="audit row id")
    _pages(a, "/v1/outbox", "outbox cursor", seen, row_kind="outbox id")
    yield Scene(a, seen, lists)


def _token(target: Target, a: Tenant) -> str:
    r = target.client.post(
        "/v1/tokens",
        json={"workspace_id": a.workspace_id, "scopes": ["read"]},
        headers=target.headers,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


KINDS = [
    "audit row id",
    "audit cursor",
    "tools cursor",
    "outbox cursor",
    "outbox id",
    "tool id",
    "tool_call id",
    "file id",
    "email message_id",
    "agent id",
    "token id",
]


@pytest.mark.parametrize("kind", KINDS)
def test_each_id_and_cursor_has_the_shape_of_a_random_id(scene: Scene, kind: str) -> None:
    values = scene.seen.values[kind]
    assert len(values) >= 3, values
    shape = SEALED if kind == "audit row id" or kind.endswith("cursor") else RANDOM_ID
    assert all(shape.fullmatch(v) for v in values), (kind, values)
    assert len(set(values)) == len(values), (kind, values)


@pytest.mark.parametrize("kind", KINDS)
def test_no_reading_of_consecutive_values_is_a_counters_step(scene: Scene, kind: str) -> None:
    values = scene.seen.values[kind]
    for earlier, later in itertools.pairwise(values):
        before, after = _readings(earlier), _readings(later)
        for reading in before.keys() & after.keys():
            step = after[reading] - before[reading]
            assert abs(step) >= FAR, (kind, reading, earlier, later, step)


def _neighbours(cursor: str) -> Iterator[str]:
    """Cursors made up from one A got: numeric neighbours in every reading, and flips."""
    for step in (-1, 1, 2, 64):
        if cursor.isdigit():
            yield str(int(cursor) + step)
        if re.fullmatch("[0-9a-f]+", cursor):
            yield format(max(int(cursor, 16) + step, 0), f"0{len(cursor)}x")
        if re.fullmatch("[a-z2-7]{26}", cursor):
            raw = int.from_bytes(base64.b32decode(cursor.upper() + "======"), "big") + step
            yield base64.b32encode(raw.to_bytes(16, "big")).decode().rstrip("=").lower()
    for i in (0, 12, 24, len(cursor) - 1):
        flipped = "b" if cursor[i] != "b" else "c"
        yield cursor[:i] + flipped + cursor[i + 1 :]


@pytest.mark.parametrize("kind", ["tools cursor", "audit cursor", "outbox cursor"])
def test_a_cursor_cannot_be_made_up_from_one_that_was_issued(scene: Scene, kind: str) -> None:
    a = scene.a
    issued = set(scene.seen.values[kind])
    for cursor in scene.seen.values[kind]:
        for made in _neighbours(cursor):
            if made in issued:
                continue
            params = {"workspace_id": a.workspace_id, "cursor": made}
            r = a.client.get(scene.lists[kind], params=params, headers=a.headers)
            assert r.status_code == 422, (kind, cursor, made, r.text)
            assert r.json()["error"]["details"][0]["field"] == "cursor"


def test_mcp_session_ids_are_random(target: Target) -> None:
    a = tenant(target.runtime, target.client, "opaque-mcp")
    agent = a.client.post(
        "/v1/agents", json={"workspace_id": a.workspace_id, "name": "m"}, headers=a.headers
    ).json()["data"]["id"]
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {**a.headers, "Accept": "application/json, text/event-stream"}
    ids = []
    with serving(target.runtime) as base, httpx.Client(base_url=base, timeout=30) as http:
        for _ in range(3):
            r = http.post(f"/mcp/agents/{agent}", json=hello, headers=headers)
            assert r.status_code == 200, r.text
            ids.append(r.headers["mcp-session-id"])
    for value in ids:
        assert uuid.UUID(hex=value).version == 4, value
    for earlier, later in itertools.pairwise(ids):
        assert abs(int(later, 16) - int(earlier, 16)) >= FAR


def test_every_replica_issues_and_accepts_the_same_strings(target: Target) -> None:
    """The sealing key lives in the database: a second process on it reads the first's."""
    second = build(Settings(data_dir=target.data_dir), sandbox=False)
    try:
        ours = target.runtime.services.audit.positions
        theirs = second.services.audit.positions
        assert ours.seal("audit", 12345) == theirs.seal("audit", 12345)
        assert theirs.open("tools-cursor", ours.seal("tools-cursor", 7)) == 7
    finally:
        second.close()
