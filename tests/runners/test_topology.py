"""The runner topology as separate processes (CONTRACT 12): API replicas on one PostgreSQL
database, runners apart from them. Every way a tool is called runs on a runner; a runner
killed mid-call costs that call an uncounted ``infra_error`` and the next call goes to the
other; a draining runner finishes its calls and takes no new ones; a runner with another
credential is refused; no runner holds a credential, and no API process has a process under
it (no sandbox, no code checker)."""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_generate import cagr
from tests.conftest import PG_URL
from tests.model_server import ScriptedModel, propose
from tests.reliability.harness import Serve, admin, fresh_postgres_database, wait_for
from tests.runners.harness import Runner, cmdline, descendants, environ, open_files, tcp_peers
from toolkiln.runners.client import RunnerClient

TOKEN = "tk_topology-admin-" + secrets.token_hex(6)
RUNNER_TOKEN = "runner-" + secrets.token_hex(16)
LLM_KEY = "sk-topology-" + secrets.token_hex(12)
SIGNING_KEY = secrets.token_hex(32)
PG_PORT = 5432
CHECKER = "toolkiln.sandbox.checker"  # a code checker's command line (sandbox/checks.py)

INNER = "def main(**p):\n    return {'message': 'inner ' + str(p.get('n'))}\n"
OUTER = (
    "def handle(input, ctx):\n"
    "    got = ctx.tools['inner']({'n': input.get('n')})\n"
    "    ctx.audit('nested', {'got': got.get('message')})\n"
    "    return {'message': 'outer saw ' + got['message']}\n"
)
# Given no ctx: run one way (runners/wire.py RunOneWay); the other on the stream.
SLEEPY = "import time\ndef main(**p):\n    time.sleep(float(p.get('s', 20)))\n    return {'message': 'woke'}\n"
SLEEPY_WITH_CTX = SLEEPY.replace("(**p)", "(*, ctx=None, **p)")


@dataclass
class Topology:
    runners: list[Runner]
    apis: list[Serve]
    model: ScriptedModel
    secrets: list[str]
    data_dirs: list[Path]

    def http(self, i: int) -> httpx.Client:
        return httpx.Client(base_url=self.apis[i].base, headers=admin(TOKEN), timeout=60)


def _wait_runners(api: Serve, count: int, state: str = "serving") -> None:
    def seen() -> bool:
        body = httpx.get(f"{api.base}/healthz", timeout=5).json()
        return sum(r["state"] == state for r in body.get("runners") or []) >= count

    wait_for(f"{count} runners {state} on {api.port}", seen, 60)


@contextlib.contextmanager
def started(runners: list[Runner], apis: list[Serve]) -> Iterator[None]:
    try:
        for r in runners:
            r.wait_listening()
        for a in apis:
            a.wait_ready(120)
        yield
    finally:
        for a in apis:
            with contextlib.suppress(Exception):
                a.terminate(60)
        for r in runners:
            with contextlib.suppress(Exception):
                r.stop()


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    tmp = tmp_path_factory.mktemp("topology")
    with fresh_postgres_database(PG_URL) as url, ScriptedModel() as model:
        runners = [Runner(tmp / f"runner{i}" / "data", RUNNER_TOKEN) for i in (1, 2)]
        env = {
            "TOOLKILN_DATABASE_URL": url,
            "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
            "TOOLKILN_FILE_SIGNING_KEY": SIGNING_KEY,
            "TOOLKILN_RUNNERS": ",".join(r.address for r in runners),
            "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
            "TOOLKILN_LLM_BASE_URL": model.url,
            "TOOLKILN_LLM_MODEL": "scripted-model",
            "TOOLKILN_LLM_API_KEY": LLM_KEY,
        }
        apis = [Serve(tmp / f"api{i}" / "data", env) for i in (1, 2)]
        with started(runners, apis):
            for api in apis:
                _wait_runners(api, 2)
            yield Topology(
                runners,
                apis,
                model,
                [url, TOKEN, SIGNING_KEY, LLM_KEY],
                [tmp / "api1" / "data", tmp / "api2" / "data"],
            )


def _workspace(http: httpx.Client) -> str:
    return str(http.get("/v1/workspaces").json()["data"][0]["id"])


def _tool(http: httpx.Client, ws: str, name: str, code: str, **extra: Any) -> dict[str, Any]:
    body = {
        "workspace_id": ws,
        "name": name,
        "language": "python",
        "code": code,
        "input_schema": {"type": "object"},
        **extra,
    }
    r = http.post("/v1/custom-tools", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json()["data"])


def _mcp_call(base: str, agent_id: str, name: str, args: dict[str, Any]) -> Any:
    import anyio
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def run() -> Any:
        async with httpx2.AsyncClient(headers=admin(TOKEN), timeout=30) as http:
            url = f"{base}/mcp/agents/{agent_id}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await session.call_tool(name, args)

    return anyio.run(run)


def test_every_way_of_calling_a_tool_runs_on_the_runners(topology: Topology) -> None:
    one, two = topology.http(0), topology.http(1)
    ws = _workspace(one)
    inner = _tool(one, ws, "inner", INNER)
    outer = _tool(one, ws, "outer", OUTER)
    # REST invoke, through each replica.
    for http in (one, two):
        r = http.post(f"/v1/custom-tools/{inner['id']}/invoke", json={"input": {"n": 1}})
        assert r.json()["data"]["message"] == "inner 1", r.text
    # ctx, nested: a tool calling a tool by name, with its audit row.
    r = two.post(f"/v1/custom-tools/{outer['id']}/invoke", json={"input": {"n": 2}})
    data = r.json()["data"]
    assert data["message"] == "outer saw inner 2" and data["ctx_calls"] == 1, data
    rows = two.get(f"/v1/tool-calls/{data['tool_call_id']}").json()["data"]["audit"]
    assert "custom.nested" in [row["event"] for row in rows]
    # An agent's tool call, and the same tool over MCP.
    agent = one.post("/v1/agents", json={"workspace_id": ws, "name": "topo"}).json()["data"]
    assert one.put(f"/v1/agents/{agent['id']}/custom-tools/{inner['id']}").status_code < 300
    call = {"name": f"custom_{inner['id']}", "arguments": {"n": 3}}
    r = two.post(f"/v1/agents/{agent['id']}/tool-calls", json=call)
    assert r.json()["data"]["message"] == "inner 3", r.text
    got = _mcp_call(topology.apis[0].base, agent["id"], f"custom_{inner['id']}", {"n": 4})
    assert got.is_error is False and "inner 4" in got.content[0].text
    # Code mode: one program calling the agent's tools.
    program = "def handle(input, ctx):\n    return ctx.tools.inner({'n': 5})\n"
    call = {"name": "run_program", "arguments": {"language": "python", "code": program}}
    r = one.post(f"/v1/agents/{agent['id']}/tool-calls", json=call)
    assert r.json()["data"]["message"] == "inner 5" and r.json()["data"]["ctx_calls"] == 1, r.text
    # A test run of an unsaved tool, and run-code in both languages.
    body = {
        "workspace_id": ws,
        "name": "draft",
        "language": "python",
        "code": INNER,
        "parameters": {"n": {"type": "integer"}},
        "input": {"n": 6},
    }
    r = two.post("/v1/custom-tools/test", json=body)
    assert r.json()["data"]["message"] == "inner 6", r.text
    js = {"language": "javascript", "code": "function main(p) { return { message: 'js' } }"}
    assert one.post("/v1/run-code", json=js).json()["data"]["message"] == "js"
    # A generation's example, run on a runner with its dry ctx.
    topology.model.script(propose(cagr()))
    r = one.post("/v1/custom-tools/generate", json={"workspace_id": ws, "description": "CAGR"})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["examples"][0]["result"]["status"] == "ok"


def _credential_free(pid: int, topology: Topology) -> None:
    env = environ(pid)
    for value in topology.secrets:
        assert value not in env, f"a credential in the environment of {cmdline(pid)}"
    files = open_files(pid)
    for data in topology.data_dirs:
        assert not [f for f in files if f.startswith(str(data))], files
    assert PG_PORT not in tcp_peers(pid), "a runner holds a database connection"


def test_runners_hold_no_credential_and_the_apis_no_process(topology: Topology) -> None:
    one = topology.http(0)
    ws = _workspace(one)
    tool = _tool(one, ws, "warm-up", INNER)
    assert one.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}}).status_code == 200
    for runner in topology.runners:
        tree = [runner.proc.pid, *descendants(runner.proc.pid)]
        assert any("template.py" in cmdline(p) for p in tree), "the runner runs the sandbox"
        for pid in tree:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                _credential_free(pid, topology)
        assert any(CHECKER in cmdline(p) for p in tree), "the runner checks tool code"
    for api in topology.apis:
        # No process runs under an API process: no sandbox, no code checker (the runners
        # parse tool code: tests/runners/test_analyse.py).
        under = descendants(api.proc.pid)
        assert under == [], [cmdline(p) for p in under]


# --- one API and two runners of a test's own: runners killed, drained, refused


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Serve, list[Runner]]]:
    runners = [Runner(tmp_path / f"runner{i}" / "data", RUNNER_TOKEN) for i in (1, 2)]
    env = {
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        "TOOLKILN_RUNNERS": ",".join(r.address for r in runners),
        "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
    }
    api = Serve(tmp_path / "api" / "data", env)
    with started(runners, [api]):
        _wait_runners(api, 2)
        yield api, runners


def _runs(runners: list[Runner]) -> dict[str, int]:
    """Runs admitted on each runner, as the runner says (a one-way run's start reaches the
    API only with its outcome)."""
    counts = {}
    for runner in runners:
        client = RunnerClient(runner.address, RUNNER_TOKEN)
        try:
            client.check()
            counts[runner.address] = client.started
        finally:
            client.close()
    return counts


def _busy(runners: list[Runner], before: dict[str, int]) -> Runner:
    """The runner the one call in flight runs on: the one that admitted a run since
    ``before`` (a runner counts a run in flight before it starts; one killed then gives the
    run to another runner, by design)."""

    def running() -> Runner | None:
        now = _runs(runners)
        for runner in runners:
            if now.get(runner.address, 0) > before.get(runner.address, 0):
                return runner
        return None

    return wait_for("a call started", running, 30)


def _in_background(http: httpx.Client, tool_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def call() -> None:
        r = http.post(f"/v1/custom-tools/{tool_id}/invoke", json={"input": payload})
        box["result"] = r.json()["data"]

    thread = threading.Thread(target=call)
    thread.start()
    box["thread"] = thread
    return box


@pytest.mark.parametrize("code", [SLEEPY, SLEEPY_WITH_CTX], ids=["one-way", "stream"])
def test_a_runner_killed_mid_call_is_an_uncounted_infra_error(
    pair: tuple[Serve, list[Runner]], code: str
) -> None:
    api, runners = pair
    http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
    ws = _workspace(http)
    sleepy = _tool(http, ws, "sleepy-" + secrets.token_hex(3), code, timeout_ms=25000)
    quick = _tool(http, ws, "quick-" + secrets.token_hex(3), INNER)
    before = _runs(runners)
    box = _in_background(http, sleepy["id"], {"s": 20})
    victim = _busy(runners, before)
    victim.kill()
    box["thread"].join(30)
    result = box["result"]
    assert result["status"] == "error" and result["error"]["code"] == "infra_error", result
    stored = http.get(f"/v1/custom-tools/{sleepy['id']}").json()["data"]
    assert stored["failure_count"] == 0 and stored["status"] == "active", stored
    # The next calls go to the runner that is left.
    for n in range(3):
        r = http.post(f"/v1/custom-tools/{quick['id']}/invoke", json={"input": {"n": n}})
        assert r.json()["data"]["message"] == f"inner {n}", r.text


def test_a_draining_runner_finishes_its_calls_and_takes_no_new_ones(
    pair: tuple[Serve, list[Runner]],
) -> None:
    api, runners = pair
    http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
    ws = _workspace(http)
    sleepy = _tool(http, ws, "sleepy", SLEEPY, timeout_ms=25000)
    quick = _tool(http, ws, "quick", INNER)
    before = _runs(runners)
    box = _in_background(http, sleepy["id"], {"s": 3})
    draining = _busy(runners, before)
    draining.proc.send_signal(signal.SIGTERM)
    for n in range(5):  # while it drains, new calls are served (by the other runner)
        r = http.post(f"/v1/custom-tools/{quick['id']}/invoke", json={"input": {"n": n}})
        assert r.json()["data"]["message"] == f"inner {n}", r.text
    box["thread"].join(30)
    assert box["result"]["status"] == "ok" and box["result"]["message"] == "woke", box["result"]
    assert draining.proc.wait(30) == 0, draining.output()


def test_a_runner_with_another_credential_is_refused(tmp_path: Path) -> None:
    good = Runner(tmp_path / "good" / "data", RUNNER_TOKEN)
    stranger = Runner(tmp_path / "stranger" / "data", "another-" + secrets.token_hex(8))
    env = {
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        "TOOLKILN_RUNNERS": f"{good.address},{stranger.address}",
        "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
    }
    api = Serve(tmp_path / "api" / "data", env)
    with started([good, stranger], [api]):
        _wait_runners(api, 1, "refused")
        body = httpx.get(f"{api.base}/healthz", timeout=5).json()
        states = {r["address"]: r["state"] for r in body["runners"]}
        assert states == {good.address: "serving", stranger.address: "refused"}, states
        metrics = httpx.get(f"{api.base}/metrics", timeout=5).text
        assert (
            f'toolkiln_runner_state{{runner="{stranger.address}",state="refused"}} 1.0' in metrics
        )
        assert f'toolkiln_runner_places{{runner="{good.address}"}}' in metrics
        assert "toolkiln_runner_queue_wait_seconds_total" in metrics
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        tool = _tool(http, _workspace(http), "quick", INNER)
        for n in range(4):
            r = http.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {"n": n}})
            assert r.json()["data"]["message"] == f"inner {n}", r.text
        # And with no runner that takes calls, the API says it cannot serve.
        good.stop()
        wait_for(
            "a 503", lambda: httpx.get(f"{api.base}/healthz", timeout=5).status_code == 503, 30
        )
