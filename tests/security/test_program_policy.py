"""Class: code mode's ``run_program`` must obey the workspace policy as ``run_code`` does.

A policy of ``builtins: []`` makes ``POST /v1/run-code`` a 403 and ``run_code`` unknown to
agents; ``run_program`` (CONTRACT 7a) runs code the caller wrote just the same, so it must
be neither offered (the code-mode tool list, REST and MCP) nor run when called (an agent's
tool call over REST, and MCP ``tools/call`` in a code-mode session). Each program below
would leave a ``custom.ran`` audit row and answer ``ran``; the checks look for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import serving
from toolkiln.app import Runtime, build
from toolkiln.config import Settings

ADMIN = "tk_program-policy-admin"
PROGRAMS = {
    "python": "async def handle(input, ctx):\n    ctx.audit('ran')\n    return 'ran'\n",
    "javascript": "async function handle(input, ctx) {\n  ctx.audit('ran');\n  return 'ran';\n}\n",
}


@dataclass
class Live:
    runtime: Runtime
    base: str
    token: str
    workspace_id: str
    agent_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    rt = build(Settings(data_dir=Path(tmp_path_factory.mktemp("program-policy"))))
    access = rt.services.access
    access.bootstrap(ADMIN)
    ws = access.create_workspace(access.authenticate(ADMIN), "no-builtins")
    token = access.create_token(None, ws.id, "read,write,invoke").value
    agent = rt.services.agents.create(access.authenticate(token), ws.id, "toolless")
    try:
        with serving(rt) as base:
            live = Live(rt, base, token, ws.id, agent.id)
            with httpx2.Client(base_url=base, headers=live.headers, timeout=30) as http:
                r = http.patch(f"/v1/workspaces/{ws.id}/policy", json={"builtins": []})
                assert r.status_code == 200, r.text
                run_code = {"language": "python", "code": PROGRAMS["python"]}
                assert http.post("/v1/run-code", json=run_code).status_code == 403
            yield live
    finally:
        rt.close()


def _ran_rows(live: Live) -> list[dict]:
    with httpx2.Client(base_url=live.base, headers=live.headers, timeout=30) as http:
        r = http.get("/v1/audit", params={"workspace_id": live.workspace_id, "event": "custom.ran"})
        assert r.status_code == 200, r.text
        return list(r.json()["data"])


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_code_mode_offers_no_program_when_the_policy_allows_no_run_code(
    live: Live, fmt: str
) -> None:
    with httpx2.Client(base_url=live.base, headers=live.headers, timeout=30) as http:
        for mode in ("code", "direct"):
            r = http.get(f"/v1/agents/{live.agent_id}/tools", params={"format": fmt, "mode": mode})
            assert r.status_code == 200, r.text
            assert r.json()["data"] == [], (mode, r.json()["data"])


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_an_agent_tool_call_of_run_program_is_refused_unrun(live: Live, language: str) -> None:
    body = {"name": "run_program", "arguments": {"language": language, "code": PROGRAMS[language]}}
    with httpx2.Client(base_url=live.base, headers=live.headers, timeout=60) as http:
        r = http.post(f"/v1/agents/{live.agent_id}/tool-calls", json=body)
    assert r.status_code == 200, r.text
    result = r.json()["data"]
    assert result["status"] == "error", result
    assert result["error"]["code"] == "unknown_tool", result["error"]
    assert result["raw_data"] is None and result["ctx_calls"] == 0, result
    assert _ran_rows(live) == []


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_mcp_code_mode_lists_nothing_and_refuses_run_program(live: Live, language: str) -> None:
    arguments = {"language": language, "code": PROGRAMS[language]}

    async def session() -> tuple[list[str], bool, str]:
        async with httpx2.AsyncClient(headers=live.headers, timeout=60) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}?mode=code&language={language}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    listed = [t.name for t in (await s.list_tools()).tools]
                    called = await s.call_tool("run_program", arguments)
                    text = "".join(getattr(c, "text", "") for c in called.content)
                    return listed, bool(called.is_error), text

    listed, is_error, text = anyio.run(session)
    assert listed == []
    assert is_error, text
    assert text.startswith("unknown_tool"), text
    assert _ran_rows(live) == []
