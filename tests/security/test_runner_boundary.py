"""The runner boundary (CONTRACT 12): code that escapes its jail lands in a process that
holds no credential, under no API process; a peer without the runner credential gets
nothing run; and what a runner sends back is evidence, read under the protocol's rules."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.conftest import PG_URL
from tests.reliability.harness import Serve, admin, fresh_postgres_database, wait_for
from tests.runners.harness import cmdline, descendants, environ, tcp_peers
from toolkiln.config import RunnerSettings
from toolkiln.domain.execution import ResourceShare, RunRequest
from toolkiln.runners import wire
from toolkiln.runners.client import NotStarted, RunnerClient, start_of
from toolkiln.runners.fleet import Fleet, RemoteShare

TOKEN = "tk_boundary-admin-" + secrets.token_hex(6)
SIGNING_KEY = secrets.token_hex(32)
LLM_KEY = "sk-boundary-" + secrets.token_hex(12)
SMTP = "smtp://mailer:pw-" + secrets.token_hex(6) + "@127.0.0.1:2525"
INNER = "def main(**p):\n    return {'message': 'inner ' + str(p.get('n'))}\n"


class Link:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.rows = 0

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: Any) -> Any:
        self.calls.append(name)
        return {"ok": True}

    def audit(self, event: str, data: Any) -> str | None:
        self.rows += 1
        return None


def test_escaped_code_finds_no_credential_above_it(tmp_path: Path) -> None:
    """``toolkiln serve`` alone: the sandbox's template and the code checkers run under a
    runner of its own, a new program (not a fork of the API) whose environment and
    connections hold none of the API's credentials; nothing else runs under the API, and the
    runner stops with it. (With the sandbox in the API's process tree, the template's parent
    held them all.)"""
    with fresh_postgres_database(PG_URL) as url:
        env = {
            "TOOLKILN_DATABASE_URL": url,
            "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
            "TOOLKILN_FILE_SIGNING_KEY": SIGNING_KEY,
            "TOOLKILN_LLM_API_KEY": LLM_KEY,
            "TOOLKILN_SMTP_URL": SMTP,
        }
        api = Serve(tmp_path / "api" / "data", env).wait_ready(120)
        try:
            http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
            body = {"language": "python", "code": INNER}
            assert http.post("/v1/run-code", json=body).json()["data"]["message"] == "inner None"
            templates = [p for p in descendants(api.proc.pid) if "template.py" in cmdline(p)]
            assert templates, "no sandbox template found"
            parents = {_parent(p) for p in templates} - set(templates)
            assert len(parents) == 1, [cmdline(p) for p in parents]
            (runner,) = parents
            assert runner != api.proc.pid, "the sandbox runs under the API process"
            assert " -m toolkiln runner --listen unix:" in cmdline(runner)
            for pid in (runner, *templates):
                text = environ(pid)
                for value in (url, TOKEN, SIGNING_KEY, LLM_KEY, SMTP):
                    assert value not in text, f"a credential in {cmdline(pid)}"
                assert 5432 not in tcp_peers(pid)
            # Nothing but the runner runs under the API: its code checkers are the runner's.
            others = set(descendants(api.proc.pid)) - {runner, *descendants(runner)}
            assert others == set(), [cmdline(p) for p in others]
            checkers = [p for p in descendants(runner) if "toolkiln.sandbox.checker" in cmdline(p)]
            assert checkers and all(environ(p).strip() == "" for p in checkers)
        finally:
            api.terminate(60)
        wait_for("the runner to stop", lambda: not Path(f"/proc/{runner}").exists(), 60)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    from toolkiln.runners.process import hosted_runner

    closers: list[Any] = []
    settings = RunnerSettings(data_dir=tmp_path_factory.mktemp("boundary"), sandbox_warm=1)
    address, token, _ = hosted_runner(settings, closers)
    yield address, token
    while closers:
        closers.pop()()


def test_a_peer_without_the_runner_credential_gets_nothing_run(hosted: tuple[str, str]) -> None:
    address, token = hosted
    for wrong in ("", "x" + token[1:], token + "x"):
        stranger = RunnerClient(address, wrong)
        stranger.check()
        assert stranger.state == "refused"
        link = Link()
        code = "def handle(i, ctx):\n    return ctx.tools.calculate({'expression': '1'})\n"
        req = RunRequest("python", code, "handle", {}, 2000, workspace_id="w")
        with pytest.raises(NotStarted):
            stranger.run(start_of(req, "share", True), link)
        assert link.calls == []
        stranger.close()
    friend = RunnerClient(address, token)
    friend.check()
    assert friend.state == "serving"
    friend.close()


HOSTILE = {
    "not-json": [b"\x00garbage"],
    "unknown-kind": [wire.encode(wire.Started(False)), b'{"op": "escape"}'],
    "bad-outcome": [wire.encode(wire.Started(False)), b'{"op": "done", "kind": "owned"}'],
    "wrong-types": [wire.encode(wire.Started(False)), b'{"op": "call", "id": "1", "tool": 1}'],
    "huge": [
        wire.encode(wire.Started(False)),
        b'{"op": "ended", "x": "' + b"a" * (3 << 20) + b'"}',
    ],
    "no-outcome": [wire.encode(wire.Started(False))],
    # More audit rows than a run's sandbox lets through (Caps.audit_rows): never all kept.
    "audit-flood": [
        wire.encode(wire.Started(False)),
        *[wire.encode(wire.AuditRow("flood", i)) for i in range(300)],
        wire.encode(wire.Done("return", {"message": "flooded"})),
    ],
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    """A "runner" that answers every run with the frames its metadata names."""

    def run(answers: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        next(answers)
        kind = dict(context.invocation_metadata()).get("x-case", "")
        yield from HOSTILE[str(kind)]

    handler = grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {"Run": grpc.stream_stream_rpc_method_handler(run, wire.identity, wire.identity)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_what_a_hostile_runner_sends_ends_the_run_as_infra(hostile: str, case: str) -> None:
    """A runner is a process tool code may have taken over: whatever it sends is read with
    caps and type checks; outside the protocol the run is ``infra`` (never counted), never
    a crash of the API or a ctx call made for it."""
    client = RunnerClient(hostile, "any")
    client.metadata = ((wire.TOKEN_KEY, "any"), ("x-case", case))
    link = Link()
    req = RunRequest("python", "def main(): pass", "main", {}, 2000, workspace_id="w")
    out = client.run(start_of(req, "share", True), link)
    client.close()
    assert out.kind == "infra", out
    assert link.calls == [] and link.rows <= 200


def test_a_nested_run_never_leaves_its_calls_runner(hosted: tuple[str, str]) -> None:
    """A run nested under a call goes to the runner of the call's root run (their shared
    cgroup slot and audit quota are that runner's) or fails as infra: never elsewhere."""
    address, token = hosted
    fleet = Fleet([address], token, watch=False)
    gone = RunnerClient("unix:/nonexistent/runner.sock", token)
    try:
        share = ResourceShare()
        root = RunRequest("python", INNER, "main", {}, 2000, workspace_id="w", share=share)
        assert fleet.run(root, Link()).kind == "return"
        assert isinstance(share.group, RemoteShare) and share.group.runner.address == address
        share.group = RemoteShare(share.group.id, gone)  # the call's runner went away
        nested = RunRequest("python", INNER, "main", {}, 2000, workspace_id="w", share=share)
        out = fleet.run(nested, Link())
        assert out.kind == "infra", out  # not placed on the runner that is left
    finally:
        gone.close()
        fleet.close()
