"""The example agent loops finish a two-tool task against a scripted model server on loopback
that speaks OpenAI's chat-completions and Anthropic's messages protocols."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

import pytest
from anthropic import Anthropic
from fastapi.testclient import TestClient
from openai import OpenAI

from tests.conftest import ROOT, Space, seed_tool

ORDER_TOOL_DESCRIPTION = "Look up the fulfillment status of an order by id."


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan(turn: int, tool_names: dict[str, str], results: list[str]) -> tuple[str, dict] | str:
    """Turn 0: calculate; turn 1: the order tool; then an answer quoting both results."""
    if turn == 0:
        return tool_names["calculate"], {"expression": "6*7"}
    if turn == 1:
        return tool_names["order"], {"order_id": "A-42"}
    return "Answer: " + " | ".join(results)


def names_of(tools: list[dict], key: str) -> dict[str, str]:
    out = {}
    for t in tools:
        spec = t.get("function", t)
        if spec["name"] == "calculate":
            out["calculate"] = spec["name"]
        if spec.get("description") == ORDER_TOOL_DESCRIPTION:
            out["order"] = spec["name"]
        assert key in (t if key != "parameters" else spec)
    return out


class Scripted(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/chat/completions"):
            results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
            step = plan(len(results), names_of(body["tools"], "parameters"), results)
            if isinstance(step, str):
                message: dict[str, Any] = {"role": "assistant", "content": step}
                finish = "stop"
            else:
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{len(results)}",
                            "type": "function",
                            "function": {"name": step[0], "arguments": json.dumps(step[1])},
                        }
                    ],
                }
                finish = "tool_calls"
            self._reply(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )
        elif self.path.endswith("/messages"):
            results = [
                b["content"]
                for m in body["messages"]
                if m["role"] == "user" and isinstance(m["content"], list)
                for b in m["content"]
                if b.get("type") == "tool_result"
            ]
            step = plan(len(results), names_of(body["tools"], "input_schema"), results)
            if isinstance(step, str):
                content: list[dict[str, Any]] = [{"type": "text", "text": step}]
                stop = "end_turn"
            else:
                content = [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{len(results)}",
                        "name": step[0],
                        "input": step[1],
                    }
                ]
                stop = "tool_use"
            self._reply(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            )
        else:
            self.send_response(404)
            self.end_headers()


def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A scripted model server on loopback for as long as the caller iterates."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    yield from serving(Scripted)


def setup(
    client: TestClient, space: Space, rw: dict[str, str], name: str = "loop"
) -> tuple[TestClient, str]:
    """The seed's order tool, enabled globally, and an agent: a client acting with ``rw``."""
    client.post("/v1/custom-tools", json=seed_tool(space, enable_globally=True), headers=rw)
    agent = client.post(
        "/v1/agents", json={"workspace_id": space.id, "name": name}, headers=rw
    ).json()["data"]
    return TestClient(client.app, headers=rw), agent["id"]


def test_openai_loop(client: TestClient, space: Space, rw, model_url: str) -> None:
    toolkiln, agent_id = setup(client, space, rw)
    model = OpenAI(api_key="test", base_url=f"{model_url}/v1")
    answer = load("openai_agent").run_agent(
        toolkiln, agent_id, model, "scripted", "6*7 and order A-42?"
    )
    assert answer == 'Answer: {"result": 42} | Order A-42 is shipped'


def test_anthropic_loop(client: TestClient, space: Space, rw, model_url: str) -> None:
    toolkiln, agent_id = setup(client, space, rw)
    model = Anthropic(api_key="test", base_url=model_url)
    answer = load("anthropic_agent").run_agent(
        toolkiln, agent_id, model, "scripted", "6*7 and order A-42?"
    )
    assert answer == 'Answer: {"result": 42} | Order A-42 is shipped'


@pytest.mark.parametrize("example", ["openai_agent", "anthropic_agent"])
def test_a_loop_against_a_local_server_needs_no_api_key(
    client: TestClient, space: Space, rw, model_url: str, monkeypatch, example: str
) -> None:
    """docs/agents.md: the loops work against a local endpoint (`--base-url`), which needs
    no key. The SDKs refuse to work without one ("Missing credentials", "Could not resolve
    authentication method"), so `python examples/openai_agent.py --base-url ...` crashed
    unless OPENAI_API_KEY happened to be set; the tests above passed a key of their own."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    toolkiln, agent_id = setup(client, space, rw)
    module = load(example)
    base = f"{model_url}/v1" if example == "openai_agent" else model_url
    model = module.model_client(base, None)
    answer = module.run_agent(toolkiln, agent_id, model, "scripted", "6*7 and order A-42?")
    assert answer == 'Answer: {"result": 42} | Order A-42 is shipped'
