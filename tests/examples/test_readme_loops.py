"""The README's last section runs as written: its OpenAI and Anthropic loops (each a script of
its own, in a process of its own) against a real Toolkiln on loopback and the scripted model
server of the example loops, and its MCP client configuration with the official MCP client.

A block of that section follows a ``<!-- model-loop NAME -->`` line (the conformance suite's
``doc-test`` blocks run without a model)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, SEED_TOOL, serving
from tests.examples.test_agent_loops import Scripted
from tests.examples.test_agent_loops import serving as model_serving
from toolkiln.app import build
from toolkiln.config import Settings

README_SERVICE = "http://127.0.0.1:8080"
BLOCK = re.compile(r"^<!-- model-loop (?P<name>\w+) -->\n```\w*\n(?P<body>.*?)^```$", re.M | re.S)
ANSWER = 'Answer: {"result": 42} | Order A-42 is shipped'  # the scripted model's last turn


def readme_blocks() -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer((ROOT / "README.md").read_text())}


@dataclass(frozen=True)
class Live:
    base: str
    token: str
    agent: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A service on a real uvicorn with the walk-through's state: the seed's order tool,
    offered to an agent, and a token with read, write and invoke."""
    rt = build(Settings(data_dir=tmp_path_factory.mktemp("readme-loops")))
    try:
        access = rt.services.access
        ws = access.create_workspace(None, "readme")
        token = access.create_token(None, ws.id, "read,write,invoke").value
        with serving(rt) as base:
            auth = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=base, headers=auth, timeout=60) as http:
                tool = {**SEED_TOOL, "workspace_id": ws.id, "enable_globally": True}
                assert http.post("/v1/custom-tools", json=tool).status_code == 201
                made = http.post("/v1/agents", json={"workspace_id": ws.id, "name": "helper"})
                yield Live(base, token, made.json()["data"]["id"])
    finally:
        rt.close()


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    yield from model_serving(Scripted)


def test_the_readme_ends_with_the_model_loops_and_an_mcp_configuration() -> None:
    blocks = readme_blocks()
    assert set(blocks) == {"openai", "anthropic", "mcp"}
    text = (ROOT / "README.md").read_text()
    last = text[text.rindex("\n## ") :]
    assert all(f"<!-- model-loop {name} -->" in last for name in blocks)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_readmes_model_loop_runs_as_written(
    live: Live, model_url: str, tmp_path: Path, provider: str
) -> None:
    script = tmp_path / f"{provider}_loop.py"
    text = readme_blocks()[provider].replace(README_SERVICE, live.base)
    assert ":8080" not in text  # never the README's own service, which may be running
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env |= {
        "TK": live.token,
        "AGENT": live.agent,
        "OPENAI_API_KEY": "test",
        "OPENAI_BASE_URL": f"{model_url}/v1",
        "ANTHROPIC_API_KEY": "test",
        "ANTHROPIC_BASE_URL": model_url,
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == ANSWER


def test_the_readmes_mcp_configuration_reaches_the_agents_tools(live: Live) -> None:
    (server,) = json.loads(readme_blocks()["mcp"])["mcpServers"].values()
    assert server["type"] == "streamable-http"
    url = server["url"].replace(README_SERVICE, live.base).replace("AGENT_ID", live.agent)
    assert ":8080" not in url
    headers = {k: v.replace("YOUR_TOKEN", live.token) for k, v in server["headers"].items()}

    async def call() -> tuple[list[str], str]:
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    names = [t.name for t in (await session.list_tools()).tools]
                    order = next(n for n in names if n.startswith("custom_"))
                    result = await session.call_tool(order, {"order_id": "A-17"})
                    assert result.is_error is False, result
                    return names, result.content[0].text

    names, text = anyio.run(call)
    assert "calculate" in names
    assert text == "Order A-17 is shipped"
