"""Slow work of one workspace cannot starve another (CONTRACT 2, issue 37).

Long work (generations, test cases, test runs, run_code and run_program at the root) takes a
place of its workspace's share; past it the answer is ``429 too_many_requests`` with
``Retry-After``, at once. And it runs off the threads that answer reads and check tokens:
while workspace A's admitted work is still in flight (a model that holds its answer, test
cases that run long), workspace B's list, audit and authenticated reads are answered.

Each test runs a service of its own on a real uvicorn, with a scripted model on loopback
that holds its answers until released: "in flight" is a condition the test controls, and
the assertions are about order (B answered while A's work had not ended), never time.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import own_service, serving
from tests.model_server import ScriptedModel, fail, held
from toolkiln.app import Runtime

ADMIN = "tk_slow-work-admin-token"
SHARE = 2  # long tasks one workspace may have at once
FLOOD = 42  # what the attack sent: more than anyio's 40 default threads
WAIT_S = 60.0  # a bound on waiting for a condition, never an expectation
READ_S = 30.0  # a bound on one of B's reads (behind A's work they waited for all of it)

SLOW_CASE = "import time\ndef main(**p):\n    time.sleep(15)\n    return {'message': 'slow'}\n"


@dataclass
class Tenant:
    workspace_id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Stage:
    runtime: Runtime
    base: str
    model: ScriptedModel
    a: Tenant
    b: Tenant


def tenant(rt: Runtime, scopes: str = "read,write,invoke") -> Tenant:
    ws = rt.services.access.create_workspace(None, f"w-{secrets.token_hex(4)}")
    return Tenant(ws.id, rt.services.access.create_token(None, ws.id, scopes).value)


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[Stage]:
    with (
        ScriptedModel() as model,
        own_service(
            tmp_path,
            ADMIN,
            llm_base_url=model.url,
            llm_model="scripted",
            llm_timeout_s=120,
            long_work_per_workspace=SHARE,
            long_work_total=8,
            long_work_retry_after_s=7,
        ) as (rt, _, _),
        serving(rt) as base,
    ):
        try:
            yield Stage(rt, base, model, tenant(rt), tenant(rt))
        finally:
            model.release()


def until(condition: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    deadline = threading.Timer(WAIT_S, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.wait(0.05), f"not within {WAIT_S:g} s: {what}"
    finally:
        deadline.cancel()


def post(base: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=WAIT_S * 2) as http:
        return http.post(path, json=body, headers=headers)


def flood(stage: Stage, send: Callable[[int], httpx.Response]) -> list[Future[httpx.Response]]:
    pool = ThreadPoolExecutor(FLOOD)
    futures = [pool.submit(send, i) for i in range(FLOOD)]
    pool.shutdown(wait=False)
    return futures


def refused(futures: list[Future[httpx.Response]]) -> list[httpx.Response]:
    return [f.result() for f in futures if f.done() and f.result().status_code == 429]


def assert_too_many(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "7"
    assert r.json()["error"]["code"] == "too_many_requests"


def b_reads(stage: Stage) -> None:
    """B's list, audit and an authenticated read (and a refused token) are answered."""
    with httpx.Client(base_url=stage.base, timeout=READ_S) as http:
        b = stage.b
        assert http.get("/v1/custom-tools", headers=b.headers).status_code == 200
        assert http.get(f"/v1/audit?workspace_id={b.workspace_id}", headers=b.headers).is_success
        assert http.get(f"/v1/workspaces/{b.workspace_id}", headers=b.headers).is_success
        bad = {"Authorization": "Bearer tk_" + "x" * 43}
        assert http.get("/v1/custom-tools", headers=bad).status_code == 401


def test_generations_past_the_share_are_429_while_other_workspaces_read(stage: Stage) -> None:
    stage.model.script(*[held(fail(500)) for _ in range(FLOOD)])
    body = {"workspace_id": stage.a.workspace_id, "description": "anything at all"}
    futures = flood(
        stage, lambda _: post(stage.base, "/v1/custom-tools/generate", body, stage.a.headers)
    )

    until(lambda: len(stage.model.requests) >= SHARE, "A's generations reach the model")
    b_reads(stage)
    # B was answered while A's admitted generations were still waiting for the model.
    assert sum(not f.done() for f in futures) >= SHARE
    until(lambda: len(refused(futures)) == FLOOD - SHARE, "A's generations past its share refused")
    for r in refused(futures):
        assert_too_many(r)
    assert len(stage.model.requests) == SHARE
    assert sum(not f.done() for f in futures) == SHARE

    stage.model.release()
    until(lambda: all(f.done() for f in futures), "A's generations end")
    assert sorted(f.result().status_code for f in futures)[-SHARE:] == [502] * SHARE
    assert stage.runtime.services.places.held() == 0


def test_test_cases_past_the_share_are_429_while_other_workspaces_read(stage: Stage) -> None:
    a = stage.a

    def create_body(i: int) -> dict[str, Any]:
        return {
            "workspace_id": a.workspace_id,
            "name": f"slow-{i}",
            "language": "python",
            "code": SLOW_CASE,
            "timeout_ms": 30000,
            "test_cases": [{"name": "slow", "input": {}, "expect": {"status": "ok"}}],
        }

    def create(i: int) -> httpx.Response:
        return post(stage.base, "/v1/custom-tools", create_body(i), a.headers)

    # The code's analysis first: 42 saves of a text not checked yet would meet the bound on
    # a workspace's code checks (429 too, with its own Retry-After) before their places.
    checked = post(stage.base, "/v1/custom-tools/validate", create_body(0), a.headers)
    assert checked.status_code == 200, checked.text
    futures = flood(stage, create)
    until(lambda: len(refused(futures)) == FLOOD - SHARE, "A's saves past its share refused")
    for r in refused(futures):
        assert_too_many(r)
    b_reads(stage)
    # B was answered while A's admitted saves were still running their test cases.
    assert sum(not f.done() for f in futures) == SHARE

    until(lambda: all(f.done() for f in futures), "A's admitted saves end")
    assert sorted(f.result().status_code for f in futures)[:SHARE] == [201] * SHARE
    assert stage.runtime.services.places.held() == 0


def test_every_long_path_takes_from_the_same_share(stage: Stage) -> None:
    """With A's share held by generations in flight, each kind of long work A starts, over
    REST, an agent's tool call and MCP, is refused; B's is not; once A's generations end,
    A's work runs again."""
    a, b = stage.a, stage.b
    stage.model.script(*[held(fail(500)) for _ in range(SHARE)])
    body = {"workspace_id": a.workspace_id, "description": "anything at all"}
    holding = [
        ThreadPoolExecutor(1).submit(post, stage.base, "/v1/custom-tools/generate", body, a.headers)
        for _ in range(SHARE)
    ]
    until(lambda: len(stage.model.requests) == SHARE, "A's generations hold its share")

    for who in (a, b):
        tool = {
            "workspace_id": who.workspace_id,
            "name": "with-cases",
            "language": "python",
            "code": "def main(**p):\n    return {'message': 'ok'}\n",
            "test_cases": [{"name": "ok", "input": {}, "expect": {"status": "ok"}}],
            "allow_failing_tests": True,  # saved without running them
        }
        saved = post(stage.base, "/v1/custom-tools", tool, who.headers)
        assert saved.status_code == 201, saved.text
        tool_id = saved.json()["data"]["id"]
        made = post(
            stage.base, "/v1/agents", {"workspace_id": who.workspace_id, "name": "ag"}, who.headers
        )
        agent_id = made.json()["data"]["id"]
        snippet = {"language": "python", "code": "def main(**p):\n    return {'message': 'x'}"}
        program = {"language": "python", "code": "def handle(input, ctx):\n    return 1\n"}
        attempts = {
            "generate": ("/v1/custom-tools/generate", body | {"workspace_id": who.workspace_id}),
            "create": ("/v1/custom-tools", tool | {"name": "again", "allow_failing_tests": False}),
            "patch": (f"/v1/custom-tools/{tool_id}", None),
            "run-tests": (f"/v1/custom-tools/{tool_id}/run-tests", {}),
            "test": ("/v1/custom-tools/test", tool | {"name": "t", "input": {}}),
            "run-code": ("/v1/run-code", snippet),
            "builtin run_code": ("/v1/builtin-tools/run_code/call", {"input": snippet}),
            "agent run_code": (
                f"/v1/agents/{agent_id}/tool-calls",
                {"name": "run_code", "arguments": snippet},
            ),
            "agent run_program": (
                f"/v1/agents/{agent_id}/tool-calls",
                {"name": "run_program", "arguments": program},
            ),
        }
        with httpx.Client(base_url=stage.base, timeout=WAIT_S) as http:
            for what, (path, payload) in attempts.items():
                if what == "patch":
                    r = http.patch(path, json={"code": snippet["code"]}, headers=who.headers)
                else:
                    r = http.post(path, json=payload, headers=who.headers)
                if who is a:
                    assert r.status_code == 429, (what, r.text)
                    assert_too_many(r)
                else:
                    assert r.status_code != 429, (what, r.text)
        mcp = call_program_over_mcp(stage.base, agent_id, who.token, program)
        if who is a:
            assert mcp.is_error and mcp.structured_content is not None
            assert mcp.structured_content["error"]["code"] == "too_many_requests"
        else:
            assert not mcp.is_error, mcp

    stage.model.release()
    until(lambda: all(f.done() for f in holding), "A's generations end")
    again = post(stage.base, "/v1/run-code", snippet, a.headers)
    assert again.status_code == 200, again.text


def call_program_over_mcp(base: str, agent_id: str, token: str, program: dict) -> Any:
    async def run() -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=WAIT_S) as http:
            url = f"{base}/mcp/agents/{agent_id}?mode=code"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await session.call_tool("run_program", program)

    return anyio.run(run)


SLEEPER = "import time\ndef main(**p):\n    time.sleep(12)\n    return {'message': 'a'}\n"
CALLS = 80  # more than the call pool's 64 threads


def test_a_flood_of_slow_calls_leaves_other_workspaces_a_thread_and_a_place(
    stage: Stage,
) -> None:
    """A sends more slow tool calls than there are call threads; B's call is answered while
    every one of A's is still in flight (A holds at most all threads but a reserve, and all
    sandbox places but one)."""
    a, b = stage.a, stage.b
    with httpx.Client(base_url=stage.base, timeout=WAIT_S) as http:
        ids = {}
        for who, code in ((a, SLEEPER), (b, "def main(**p):\n    return {'message': 'b'}\n")):
            tool = {"workspace_id": who.workspace_id, "name": "t", "language": "python"}
            r = http.post(
                "/v1/custom-tools",
                json=tool | {"code": code, "timeout_ms": 30000},
                headers=who.headers,
            )
            assert r.status_code == 201, r.text
            ids[who.token] = r.json()["data"]["id"]

        def invoke(who: Tenant) -> httpx.Response:
            path = f"/v1/custom-tools/{ids[who.token]}/invoke"
            return post(stage.base, path, {"input": {}}, who.headers)

        invoke(a)  # A's token is known: its calls wait as A's (services/turns.py)
        pool = ThreadPoolExecutor(CALLS)
        futures = [pool.submit(invoke, a) for _ in range(CALLS)]
        pool.shutdown(wait=False)

        def load() -> int:
            runners = http.get("/healthz").json()["runners"]
            return sum(r["in_flight"] + r["waiting"] for r in runners)

        until(lambda: load() >= 40, "A's calls hold the sandbox's places and wait for more")
        r = invoke(b)
        assert r.status_code == 200 and r.json()["data"]["message"] == "b", r.text
        ended = [f.result().text[:300] for f in futures if f.done()]
        assert not ended, f"B waited for one of A's slow calls to end: {ended}"
