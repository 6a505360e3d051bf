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

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import databases
from client import Conn
from mcp.types import LATEST_PROTOCOL_VERSION as PROTOCOL
from service import (
    EXE,
    N_SEQ,
    PY_TOOL,
    TOKEN,
    WARM_UP,
    create,
    free_port,
    invoke_url,
    pct,
    start_service,
    stop,
    timed,
    workspace,
)

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


class Ways:
    """The tool over REST invoke, MCP ``tools/call`` (one session) and the agent's tool-call
    route, on one service: each way a function timing one call (ms)."""

    def __init__(self, port: int, ws: str, tool_id: str) -> None:
        self.port, self.tool_id, self.name = port, tool_id, f"custom_{tool_id}"
        self.conn = Conn(port, TOKEN)
        self.agent = agent_for(self.conn, ws, tool_id)
        self.session = McpSession(self.conn, self.agent)

    def reconnect(self) -> None:
        """A fresh connection (the MCP session goes on over it): the service closes one idle
        past its keep-alive (5 s), which another service's rounds can take."""
        self.conn.close()
        self.conn = self.session.conn = Conn(self.port, TOKEN)

    def rest(self) -> float:
        return timed(self.conn, "POST", invoke_url(self.tool_id), {"input": {}})

    def mcp(self) -> float:
        return self.session.call_tool(self.name, {})

    def agent_call(self) -> float:
        body = {"name": self.name, "arguments": {}}
        return timed(self.conn, "POST", f"/v1/agents/{self.agent}/tool-calls", body)

    def each(self) -> dict[str, Callable[[], float]]:
        return {"rest": self.rest, "mcp": self.mcp, "agent": self.agent_call}


def rounds_of(
    services: dict[str, Ways], n: int, rounds: int = 10
) -> dict[str, dict[str, list[float]]]:
    """Each service's three ways in ``rounds`` alternating rounds of n / rounds calls each
    (after a warm-up): a busy minute weighs on them alike."""
    for ways in services.values():
        if len(services) > 1:
            ways.reconnect()
        for way in ways.each().values():
            for _ in range(min(WARM_UP, n)):
                way()
    out = {label: {key: [] for key in ways.each()} for label, ways in services.items()}
    per_round = max(1, n // rounds)
    for _ in range(rounds):
        for label, ways in services.items():
            if len(services) > 1:
                ways.reconnect()
            for key, way in ways.each().items():
                out[label][key] += [way() for _ in range(per_round)]
    return out


def three_ways(
    port: int, ws: str, tool_id: str, n: int, rounds: int = 10
) -> dict[str, list[float]]:
    """The three ways on one service; each way's p50 is compared with the REST invoke of the
    same rounds."""
    ways = Ways(port, ws, tool_id)
    try:
        return rounds_of({"": ways}, n, rounds)[""]
    finally:
        ways.conn.close()


def main() -> None:
    """``python bench/protocols.py [OTHER]``: the three ways alone, on this checkout's
    service and, given OTHER (another checkout with its ``.venv``, e.g. a worktree of main),
    on that one's too, in alternating rounds (BENCH_SEQ calls a way, default 500;
    BENCH_DATABASE=postgresql for a fresh PostgreSQL database each)."""
    kind = os.environ.get("BENCH_DATABASE", "sqlite")
    exes = {"this checkout": EXE}
    if len(sys.argv) > 1:
        exes = {"given checkout": Path(sys.argv[1]) / ".venv" / "bin" / "toolkiln", **exes}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolkiln-mcp-")))
        services = {}
        for label, exe in exes.items():
            url = stack.enter_context(databases.fresh(kind))
            port = free_port()
            proc = start_service(tmp / label.replace(" ", "-"), port, exe=exe, database_url=url)
            stack.callback(stop, proc)
            print(f"{label}: pid {proc.pid}", flush=True)
            c = Conn(port, TOKEN)
            ws = workspace(c)
            services[label] = Ways(port, ws, create(c, ws, "bench-python", "python", PY_TOOL))
            c.close()
        load = os.getloadavg()[0]
        found = rounds_of(services, N_SEQ)
    print(f"{databases.LABELS[kind]}, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| service | REST p50 / p99 | MCP tools/call p50 / p99 | agent tool-call p50 / p99 |")
    print("|---|---|---|---|")
    for label, m in found.items():
        rest = pct(m["rest"], 0.5)
        cells = [
            f"{pct(m[k], 0.5):.2f} / {pct(m[k], 0.99):.2f} ms ({pct(m[k], 0.5) / rest:.2f}x)"
            for k in ("mcp", "agent")
        ]
        print(f"| {label} | {rest:.2f} / {pct(m['rest'], 0.99):.2f} ms | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
