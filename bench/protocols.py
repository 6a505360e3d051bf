"""The other ways in to the same tool: an MCP ``tools/call`` (streamable HTTP at
``/mcp/agents/{agent_id}``) and an agent's tool call (``POST
/v1/agents/{agent_id}/tool-calls``), timed next to the REST invoke.

The MCP session is spoken with bench/client.py, not the official SDK's client: on this
machine the SDK's client (httpx, anyio streams, pydantic models) spent ~2.5 ms of CPU per
``tools/call`` on the load generator's side, taken from the two cores the service runs on;
this one, which writes the JSON-RPC request and reads the event stream's ``data:`` line
back, ~0.2 ms (the same session, 300 calls each, load average 13). The session is opened
as the SDK opens one: ``initialize`` (its answer names the session),
``notifications/initialized``, then each call with the session's id and the protocol
version in its headers.
"""

from __future__ import annotations

import json
import time
from typing import Any

from client import Conn
from mcp.types import LATEST_PROTOCOL_VERSION as PROTOCOL
from service import WARM_UP, invoke_url, timed

ACCEPT = {"Accept": "application/json, text/event-stream"}


def _events(raw: bytes) -> list[Any]:
    """The JSON-RPC messages of an event stream (or of a plain JSON answer)."""
    text = raw.decode()
    if text.lstrip().startswith("{"):
        return [json.loads(text)]
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


class McpSession:
    """One MCP session over one keep-alive connection."""

    def __init__(self, conn: Conn, agent_id: str) -> None:
        self.conn, self.path, self.next_id = conn, f"/mcp/agents/{agent_id}", 1
        status, fields, raw = conn.exchange("POST", self.path, self._rpc("initialize", {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "toolkiln-bench", "version": "0"},
        }), ACCEPT)  # fmt: skip
        assert status == 200, (status, raw)
        self.headers = {
            **ACCEPT,
            "mcp-session-id": fields["mcp-session-id"],
            "mcp-protocol-version": _events(raw)[-1]["result"]["protocolVersion"],
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        status, _, raw = conn.exchange("POST", self.path, note, self.headers)
        assert status == 202, (status, raw)

    def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        return {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> float:
        """One ``tools/call``, timed from send to its answer's last byte (ms)."""
        body = self._rpc("tools/call", {"name": name, "arguments": arguments})
        t = time.perf_counter()
        status, _, raw = self.conn.exchange("POST", self.path, body, self.headers)
        took = (time.perf_counter() - t) * 1000
        answer = [m for m in _events(raw) if m.get("id") == body["id"]]
        assert status == 200 and answer, (status, raw)
        assert answer[0]["result"]["isError"] is False, answer
        return took


def agent_for(c: Conn, ws: str, tool_id: str) -> str:
    """An agent offered the tool; its id."""
    status, answer = c.call("POST", "/v1/agents", {"workspace_id": ws, "name": "bench-agent"})
    assert status == 201, answer
    agent = str(answer["data"]["id"])
    status, answer = c.call("PUT", f"/v1/agents/{agent}/custom-tools/{tool_id}", {})
    assert status == 200, answer
    return agent


def three_ways(c: Conn, ws: str, tool_id: str, n: int, rounds: int = 10) -> dict[str, list[float]]:
    """The tool over REST invoke, MCP ``tools/call`` (one session) and the agent's tool-call
    route, in ``rounds`` alternating rounds of n / rounds calls each: a busy minute weighs
    on the three alike. Each way's p50 is compared with the REST invoke of the same rounds."""
    agent = agent_for(c, ws, tool_id)
    session = McpSession(c, agent)
    name = f"custom_{tool_id}"
    ways = {
        "rest": lambda: timed(c, "POST", invoke_url(tool_id), {"input": {}}),
        "mcp": lambda: session.call_tool(name, {}),
        "agent": lambda: timed(
            c, "POST", f"/v1/agents/{agent}/tool-calls", {"name": name, "arguments": {}}
        ),
    }
    for way in ways.values():
        for _ in range(min(WARM_UP, n)):
            way()
    out: dict[str, list[float]] = {key: [] for key in ways}
    per_round = max(1, n // rounds)
    for _ in range(rounds):
        for key, way in ways.items():
            out[key] += [way() for _ in range(per_round)]
    return out
