"""The workspace's ``max_timeout_ms`` is the ceiling of every run in it, also of code that
never passes the save-time check: a code-mode program (``run_program``, whose default is
30 s) and ``run_code`` (5 s) given as source at call time, through the API and an agent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.security.conftest import SECRET, Target
from tests.security.tenants import Tenant, tenant

CEILING_MS = 1000
SLEEPER = {
    "python": "import time\ndef handle(input, ctx):\n    time.sleep(4)\n    return 'slept'\n",
    "javascript": "function handle(input, ctx) {\n  while (true) {}\n  return 1;\n}\n",
}
ADMIN = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture(scope="module")
def space(target: Target) -> tuple[Tenant, str]:
    t = tenant(target.runtime, target.client, "policy-ceilings")
    r = target.client.patch(
        f"/v1/workspaces/{t.workspace_id}/policy",
        json={"max_timeout_ms": CEILING_MS},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    r = target.client.post(
        "/v1/agents", json={"workspace_id": t.workspace_id, "name": "ceiling"}, headers=t.headers
    )
    assert r.status_code == 201, r.text
    return t, str(r.json()["data"]["id"])


def _timed(call: Any) -> tuple[dict, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def _stopped_at_the_ceiling(result: dict, took: float) -> None:
    assert result["status"] == "error" and result["error"]["code"] == "timeout", result["error"]
    assert took < 3.0, f"ran {took:.1f} s under a {CEILING_MS} ms ceiling"


@pytest.mark.parametrize("language", ["python", "javascript"])
@pytest.mark.parametrize("asked", [None, 30000])
def test_a_program_is_held_to_the_workspace_ceiling(
    target: Target, space: tuple[Tenant, str], language: str, asked: int | None
) -> None:
    t, agent = space
    arguments: dict[str, Any] = {"language": language, "code": SLEEPER[language]}
    if asked is not None:
        arguments["timeout_ms"] = asked

    _stopped_at_the_ceiling(*_timed(lambda: _tool_call(target, t, agent, "run_program", arguments)))
    target.assert_contained()


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_run_code_is_held_to_the_workspace_ceiling(
    target: Target, space: tuple[Tenant, str], language: str
) -> None:
    t, agent = space

    def over_the_api() -> dict:
        body = {"language": language, "code": SLEEPER[language]}
        r = target.client.post("/v1/run-code", json=body, headers=t.headers)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    def by_the_agent() -> dict:
        arguments = {"language": language, "code": SLEEPER[language]}
        return _tool_call(target, t, agent, "run_code", arguments)

    _stopped_at_the_ceiling(*_timed(over_the_api))
    _stopped_at_the_ceiling(*_timed(by_the_agent))
    target.assert_contained()


def _tool_call(target: Target, t: Tenant, agent: str, name: str, arguments: dict) -> dict:
    """One agent tool call over the API; its Result."""
    r = target.client.post(
        f"/v1/agents/{agent}/tool-calls",
        json={"name": name, "arguments": arguments},
        headers=t.headers,
    )
    assert r.status_code == 200, r.text
    return dict(r.json()["data"])
