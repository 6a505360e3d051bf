"""The code-mode example loop finishes a two-tool task in one program, with the OpenAI and the
Anthropic SDK, against a scripted model server on loopback (real HTTP, both protocols)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic
from fastapi.testclient import TestClient
from openai import OpenAI

from tests.conftest import Space
from tests.examples.test_agent_loops import Scripted as AgentLoopModel
from tests.examples.test_agent_loops import load, serving, setup

# What the scripted model writes after reading run_program's description: one program that
# calls the order tool and a built-in by the names the description declares.
PROGRAM = """
async def handle(input, ctx):
    order = await ctx.tools.lookup_order_status({"order_id": "A-42"})
    calc = await ctx.tools.calculate({"expression": "6*7"})
    return {"message": f"{order['message']}; 6*7 = {calc['result']}"}
"""
seen: list[dict[str, Any]] = []


class Scripted(AgentLoopModel):
    """The same scripted model server, answering with one run_program call."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen.append(body)
        args = {"language": "python", "code": PROGRAM}
        if self.path.endswith("/chat/completions"):
            results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
            assert [t["function"]["name"] for t in body["tools"]] == ["run_program"]
            if results:
                message: dict[str, Any] = {"role": "assistant", "content": f"Answer: {results[0]}"}
            else:
                call = {"id": "call_0", "type": "function"}
                call["function"] = {"name": "run_program", "arguments": json.dumps(args)}
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
            self._reply(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )
            return
        results = [
            b["content"]
            for m in body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        assert [t["name"] for t in body["tools"]] == ["run_program"]
        if results:
            content: list[dict[str, Any]] = [{"type": "text", "text": f"Answer: {results[0]}"}]
        else:
            content = [{"type": "tool_use", "id": "toolu_0", "name": "run_program", "input": args}]
        self._reply(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": "tool_use" if not results else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    yield from serving(Scripted)


EXPECTED = "Answer: Order A-42 is shipped; 6*7 = 42"


def test_openai_code_mode_loop(client: TestClient, space: Space, rw, model_url: str) -> None:
    toolkiln, agent_id = setup(client, space, rw, "coder")
    model = OpenAI(api_key="test", base_url=f"{model_url}/v1")
    answer = load("code_mode_agent").run_openai(toolkiln, agent_id, model, "scripted", "go")
    assert answer == EXPECTED


def test_anthropic_code_mode_loop(client: TestClient, space: Space, rw, model_url: str) -> None:
    toolkiln, agent_id = setup(client, space, rw, "coder")
    model = Anthropic(api_key="test", base_url=model_url)
    answer = load("code_mode_agent").run_anthropic(toolkiln, agent_id, model, "scripted", "go")
    assert answer == EXPECTED
    description = seen[-1]["tools"][0]["description"]
    assert "def lookup_order_status(*, order_id: str) -> ToolResult" in description


def test_code_mode_against_a_local_server_needs_no_api_key(
    client: TestClient, space: Space, rw, model_url: str, monkeypatch
) -> None:
    """As tests/examples/test_agent_loops.py: no key in the environment, a local server."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    toolkiln, agent_id = setup(client, space, rw, "coder")
    example = load("code_mode_agent")
    model = example.openai_client(f"{model_url}/v1", None)
    assert example.run_openai(toolkiln, agent_id, model, "scripted", "go") == EXPECTED
    claude = example.anthropic_client(model_url, None)
    assert example.run_anthropic(toolkiln, agent_id, claude, "scripted", "go") == EXPECTED
