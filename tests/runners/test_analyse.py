"""Static checks of tool code run on the runners (``Analyse``), never in the API's process:
saves, validates and test runs get their analysis from a runner (a remote one over TCP, with
its token), the API loads no parser of tool code and holds no checker process, one
workspace's checks are admitted by the API across runners, a runner that went away is
replaced by another, a runner's answer is checked before it is used, and with no runner a
check is a clear 503."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi.testclient import TestClient

from tests.conftest import PG_URL, free_port
from tests.reliability.harness import Serve, admin, fresh_postgres_database, wait_for
from tests.runners.harness import Runner, cmdline, descendants
from toolkiln.api.app import create_app
from toolkiln.app import build
from toolkiln.config import Settings
from toolkiln.domain.analysis import FAILED, QUEUED
from toolkiln.domain.errors import TooManyRequests
from toolkiln.runners import wire
from toolkiln.runners.analyser import RemoteAnalyser
from toolkiln.runners.client import RunnerClient
from toolkiln.runners.fleet import Fleet

TOKEN = "tk_analyse-admin-" + secrets.token_hex(6)
RUNNER_TOKEN = "runner-" + secrets.token_hex(16)
CHECKER = "toolkiln.sandbox.checker"  # a code checker's command line (sandbox/checks.py)
# What parses tool code: the checker program, its parsers, and the pool that starts it.
PARSERS = (
    "tree_sitter",
    "tree_sitter_javascript",
    "toolkiln.domain.code_check",
    "toolkiln.sandbox.checker",
    "toolkiln.sandbox.checks",
)
# What installs packages for tools: the runners' alone (each runner's sandboxes).
INSTALLERS = ("toolkiln.sandbox.packages", "toolkiln.sandbox.runner")
FSTRING = "def main(**p):\n    return {'message': f'" + "{1=}" * 65_000 + "'}\n"


def _code(n: int) -> str:
    return f"def main(**p):\n    return {{'message': 'n{n}'}}\n"


def _tool(ws: str, name: str, code: str, **extra: Any) -> dict[str, Any]:
    return {
        "workspace_id": ws,
        "name": name,
        "language": "python",
        "code": code,
        "input_schema": {"type": "object"},
        **extra,
    }


def _analyses(runners: list[Runner]) -> int:
    """Analyses the runners made, as they say (``Health``)."""
    total = 0
    for runner in runners:
        probe = RunnerClient(runner.address, RUNNER_TOKEN)
        try:
            probe.check()
            assert probe.usable, runner.output()
            total += probe.analyses
        finally:
            probe.close()
    return total


@pytest.fixture(scope="module")
def runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Runner]]:
    tmp = tmp_path_factory.mktemp("analyse")
    started = [Runner(tmp / f"runner{i}" / "data", RUNNER_TOKEN) for i in (1, 2)]
    try:
        for runner in started:
            runner.wait_listening()
        yield started
    finally:
        for runner in started:
            runner.stop()


def test_saves_and_test_runs_are_analysed_on_a_remote_runner(
    runners: list[Runner], tmp_path: Path
) -> None:
    """A real ``toolkiln serve`` (PostgreSQL) with one remote runner over TCP and its token:
    each new text is analysed there, once, and nothing runs under the API process."""
    (runner,) = runners[:1]
    with fresh_postgres_database(PG_URL) as url:
        env = {
            "TOOLKILN_DATABASE_URL": url,
            "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
            "TOOLKILN_RUNNERS": runner.address,
            "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
        }
        api = Serve(tmp_path / "api" / "data", env).wait_ready(120)
        try:
            http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
            ws = http.get("/v1/workspaces").json()["data"][0]["id"]
            before = _analyses([runner])
            broken = "def main(**p):\n    return (\n"
            r = http.post("/v1/custom-tools/validate", json=_tool(ws, "broken", broken))
            assert r.status_code == 422, r.text
            [found] = r.json()["error"]["details"]
            assert found["field"] == "code" and found["line"] == 2, found
            r = http.post("/v1/custom-tools/validate", json=_tool(ws, "ok", _code(1)))
            assert r.status_code == 200, r.text
            r = http.post("/v1/custom-tools", json=_tool(ws, "saved", _code(2)))
            assert r.status_code == 201, r.text
            tool_id = r.json()["data"]["id"]
            r = http.post("/v1/custom-tools/test", json={**_tool(ws, "t", _code(3)), "input": {}})
            assert r.json()["data"]["message"] == "n3", r.text
            # A stored version's call uses the analysis kept when it was saved.
            r = http.post(f"/v1/custom-tools/{tool_id}/invoke", json={"input": {}})
            assert r.json()["data"]["message"] == "n2", r.text
            assert _analyses([runner]) - before == 4
            wanted = f'toolkiln_runner_analyses_total{{runner="{runner.address}"}} {before + 4}.0'
            wait_for(
                "the checks on /metrics",
                lambda: wanted in httpx.get(f"{api.base}/metrics", timeout=5).text,
                30,
            )
            assert descendants(api.proc.pid) == [], [cmdline(p) for p in descendants(api.proc.pid)]
            assert any(CHECKER in cmdline(p) for p in descendants(runner.proc.pid))
        finally:
            api.terminate(60)


API_PROCESS = r"""
import json, sys
from fastapi.testclient import TestClient
from toolkiln.api.app import create_app
from toolkiln.app import build
from toolkiln.config import Settings

rt = build(Settings())
rt.services.access.bootstrap(sys.argv[1])
auth = {"Authorization": "Bearer " + sys.argv[1]}
answers = []
with TestClient(create_app(rt.services)) as c:
    ws = c.get("/v1/workspaces", headers=auth).json()["data"][0]["id"]
    def tool(name, code, language="python", **extra):
        return {"workspace_id": ws, "name": name, "language": language, "code": code,
                "input_schema": {"type": "object"}, **extra}
    py = "def main(**p):\n    return {'message': 'py'}\n"
    js = "export function main(p) { return { message: 'js' } }\n"
    sends = [
        ("/v1/custom-tools/validate", tool("bad", "def main(:\n")),
        ("/v1/custom-tools/validate", tool("js", js, "javascript")),
        ("/v1/custom-tools", tool("saved", py)),
        ("/v1/custom-tools/test", tool("draft", py + "#\n", input={})),
        ("/v1/run-code", {"language": "javascript", "code": js + "//\n"}),
    ]
    for path, body in sends:
        r = c.post(path, json=body, headers=auth)
        answers.append([r.status_code, r.json()])
    saved = answers[2][1]["data"]["id"]
    r = c.post(f"/v1/custom-tools/{saved}/invoke", json={"input": {}}, headers=auth)
    answers.append([r.status_code, r.json()])
print(json.dumps({"modules": sorted(sys.modules), "answers": answers}))
rt.close()
"""


def test_the_api_process_never_loads_a_parser_of_tool_code(
    runners: list[Runner], tmp_path: Path
) -> None:
    """An API process of its own (SQLite), on the remote runners: after validates, a save, a
    test run, run-code and a call, none of the modules that parse tool code or install
    packages is loaded."""
    env = {
        "PATH": "/usr/bin:/bin",
        "TOOLKILN_DATA_DIR": str(tmp_path / "data"),
        "TOOLKILN_RUNNERS": ",".join(r.address for r in runners),
        "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
    }
    done = subprocess.run(
        [sys.executable, "-c", API_PROCESS, TOKEN],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    bad, js, saved, draft, run, call = seen["answers"]
    assert bad[0] == 422 and bad[1]["error"]["details"][0]["line"] == 1, bad
    assert js[0] == 200 and saved[0] == 201, (js, saved)
    assert draft[1]["data"]["message"] == "py" and run[1]["data"]["message"] == "js"
    assert call[1]["data"]["message"] == "py", call
    assert "toolkiln.runners.analyser" in seen["modules"]
    assert [m for m in PARSERS + INSTALLERS if m in seen["modules"]] == []


def test_one_workspace_is_admitted_across_runners(runners: list[Runner]) -> None:
    """Each runner lets a workspace have four checks running or waiting; across two runners
    that would be eight. The API admits four of one workspace in all, refuses a fifth at
    once, and another workspace's text is checked meanwhile."""
    fleet = Fleet([r.address for r in runners], RUNNER_TOKEN, watch=False)
    analyser = RemoteAnalyser(fleet)
    try:
        found: list[Any] = []
        slow = [
            threading.Thread(
                target=lambda i=i: found.append(analyser.analyse("python", FSTRING + f"#{i}", "a"))
            )
            for i in range(QUEUED)
        ]
        for t in slow:
            t.start()
        wait_for("four checks under way", lambda: analyser.queue.count("a") == QUEUED, 30)
        with pytest.raises(TooManyRequests) as refused:
            analyser.analyse("python", FSTRING + "#late", "a")
        assert refused.value.retry_after_s >= 1
        assert len(found) == 0, "a slow check ended before the refusal"
        assert analyser.analyse("python", _code(7), "b").entrypoint == "main"
        for t in slow:
            t.join(60)
        assert all(a.limit in ("time", "memory") for a in found), found
        assert analyser.analyse("python", _code(8), "a").entrypoint == "main"
    finally:
        fleet.close()


def test_one_workspace_is_held_to_its_share_of_a_runner_across_api_processes(
    runners: list[Runner],
) -> None:
    """Two API processes' analysers, three slow checks of one workspace each (within each
    one's own admission), to one runner: it runs two, queues two and refuses the rest."""
    fleets = [Fleet([runners[1].address], RUNNER_TOKEN, watch=False) for _ in range(2)]
    outcomes: list[str] = []
    lock = threading.Lock()

    def check(analyser: RemoteAnalyser, i: int) -> None:
        try:
            found = analyser.analyse("python", FSTRING + f"#across{i}", "shared")
            outcome = found.limit or "analysed"
        except TooManyRequests:
            outcome = "refused"
        with lock:
            outcomes.append(outcome)

    try:
        analysers = [RemoteAnalyser(f) for f in fleets]
        threads = [threading.Thread(target=check, args=(analysers[i % 2], i)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert sorted(outcomes).count("refused") == 2, outcomes
        assert all(o in ("time", "memory", "refused") for o in outcomes), outcomes
    finally:
        for fleet in fleets:
            fleet.close()


def test_a_runner_gone_before_answering_is_replaced_by_another(
    runners: list[Runner], tmp_path: Path
) -> None:
    victim = Runner(tmp_path / "victim" / "data", RUNNER_TOKEN).wait_listening()
    survivor = runners[0]
    fleet = Fleet([victim.address, survivor.address], RUNNER_TOKEN, watch=False)
    analyser = RemoteAnalyser(fleet)
    try:
        by = {r.address: r for r in fleet.runners()}
        assert all(r.usable for r in by.values())
        victim.kill()
        # As last said, the survivor is busy and the victim idle: the victim is asked first.
        by[survivor.address].in_flight = 1000
        before = _analyses([survivor])
        assert analyser.analyse("python", _code(9), "w").entrypoint == "main"
        assert _analyses([survivor]) == before + 1
    finally:
        fleet.close()
        victim.stop()


# --- what a runner answers is evidence: a runner of the test's own answers anything


def _answer(**fields: Any) -> bytes:
    return json.dumps({"op": "analysed", **fields}).encode()


GOOD = {"problems": [], "entrypoint": "main", "imports": [], "script": ""}
HOSTILE: dict[str, bytes] = {
    "not-json": b"\x00garbage",
    "another-kind": wire.encode(wire.Done("return", {"message": "x"})),
    "wrong-types": _answer(problems="none", entrypoint=1),
    "unknown-field": _answer(**GOOD, owned=True),
    "over-the-cap": _answer(**{**GOOD, "script": "a" * (9 * wire.MIB)}),
    "problems-and-entrypoint": _answer(
        **{**GOOD, "problems": [{"field": "code", "message": "no"}]}
    ),
    "script-for-python": _answer(**{**GOOD, "script": "main()"}),
    "imports-longer-than-the-code": _answer(**{**GOOD, "imports": ["x" * 200, "y" * 200]}),
    "a-line-past-the-code": _answer(
        **{**GOOD, "entrypoint": "", "problems": [{"field": "code", "message": "m", "line": 10**6}]}
    ),
    "too-many-problems": _answer(
        **{**GOOD, "entrypoint": "", "problems": [{"field": "code", "message": "m"}] * 6}
    ),
    "another-field's-problem": _answer(
        **{**GOOD, "entrypoint": "", "problems": [{"field": "name", "message": "m"}]}
    ),
    "a-lone-surrogate": b'{"op":"analysed","problems":[{"field":"code","message":"\\ud800"}]}',
    "an-unknown-limit": _answer(
        **{**GOOD, "entrypoint": "", "problems": [{"field": "code", "message": "m"}]},
        limit="owned",
    ),
    "a-limit-and-an-entrypoint": _answer(**GOOD, limit="time"),
    "an-unknown-refusal": _answer(refused="owned"),
}
REFUSALS = {"queued": (429, "too_many_requests"), "busy": (503, "unavailable")}


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[str, list[str]]]:
    """A "runner" that says it serves, and answers each analysis with what the comment at
    the end of its text names; the cases it was asked."""
    asked: list[str] = []

    def health(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b'{"state": "serving", "places": 4, "in_flight": 0, "waiting": 0}'

    def analyse(request: bytes, context: grpc.ServicerContext) -> bytes:
        case = json.loads(request)["code"].rsplit("# ", 1)[1].strip()
        asked.append(case)
        if case in REFUSALS:
            return _answer(refused=case)
        return HOSTILE[case] if case in HOSTILE else _answer(**GOOD)

    unary = grpc.unary_unary_rpc_method_handler
    handler = grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {
            "Health": unary(health, wire.identity, wire.identity),
            "Describe": unary(lambda r, c: b"{}", wire.identity, wire.identity),
            "Analyse": unary(analyse, wire.identity, wire.identity),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", asked
    server.stop(None)


@pytest.fixture(scope="module")
def on_hostile(
    hostile: tuple[str, list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, str]]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("on-hostile"),
        runners=hostile[0],
        runner_token=RUNNER_TOKEN,
    )
    rt = build(settings)
    try:
        rt.services.access.bootstrap(TOKEN)
        with TestClient(create_app(rt.services), raise_server_exceptions=False) as client:
            client.headers.update(admin(TOKEN))
            ws = client.get("/v1/workspaces").json()["data"][0]["id"]
            yield client, ws
    finally:
        rt.close()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_answer_out_of_the_rules_is_not_used(
    on_hostile: tuple[TestClient, str], hostile: tuple[str, list[str]], case: str
) -> None:
    client, ws = on_hostile
    code = f"def main(**p):\n    return {{'message': 'x'}}\n# {case}\n"
    for _ in range(2):  # refused each time: an analysis that failed is never kept
        r = client.post("/v1/custom-tools/validate", json=_tool(ws, "hostile", code))
        assert r.status_code == 422, r.text
        [found] = r.json()["error"]["details"]
        assert found["field"] == "code" and FAILED in found["message"], found
    assert hostile[1][-2:] == [case, case]


def test_an_honest_answer_through_the_same_runner_is_used(
    on_hostile: tuple[TestClient, str],
) -> None:
    client, ws = on_hostile
    code = "def main(**p):\n    return {'message': 'x'}\n# honest\n"
    r = client.post("/v1/custom-tools/validate", json=_tool(ws, "honest", code))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_runners_refusal_is_the_checkers_own(
    on_hostile: tuple[TestClient, str], case: str
) -> None:
    client, ws = on_hostile
    code = f"def main(**p):\n    return {{'message': 'x'}}\n# {case}\n"
    r = client.post("/v1/custom-tools/validate", json=_tool(ws, "refused", code))
    status, error = REFUSALS[case]
    assert r.status_code == status and r.json()["error"]["code"] == error, r.text


@pytest.fixture
def without_analyse() -> Iterator[str]:
    """A runner of a release without ``Analyse``: it serves, and knows no such method."""

    def health(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b'{"state": "serving", "places": 4, "in_flight": 0, "waiting": 0}'

    handler = grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {"Health": grpc.unary_unary_rpc_method_handler(health, wire.identity, wire.identity)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("which", ["unreachable", "without-analyse"])
def test_with_no_runner_a_check_is_a_clear_503(
    tmp_path: Path, without_analyse: str, which: str
) -> None:
    nobody = f"127.0.0.1:{free_port()}" if which == "unreachable" else without_analyse
    rt = build(Settings(data_dir=tmp_path, runners=nobody, runner_token=RUNNER_TOKEN))
    try:
        rt.services.access.bootstrap(TOKEN)
        with TestClient(create_app(rt.services), raise_server_exceptions=False) as client:
            client.headers.update(admin(TOKEN))
            ws = client.get("/v1/workspaces").json()["data"][0]["id"]
            for path in ("/v1/custom-tools/validate", "/v1/custom-tools"):
                r = client.post(path, json=_tool(ws, "nowhere", _code(10)))
                assert r.status_code == 503, r.text
                error = r.json()["error"]
                assert error["code"] == "unavailable" and "runner" in error["message"], error
            assert client.get("/v1/custom-tools", params={"workspace_id": ws}).json()["data"] == []
    finally:
        rt.close()
