"""No request stalls the service by the code it sends: tool code is parsed in checker
processes, bounded in time and memory, while everyone else's requests are answered.

CPython parses a 256 KiB f-string of 65,000 ``{1=}`` fields in quadratic time holding the GIL
(5-11 s on two cores), and tree-sitter takes seconds over 256 KB of bracket junk: in the
service's process either held every request, ``/healthz`` included. Each case sends one to
an endpoint that checks code and, once the service has read that request, needs ten answers
in a row from ``/healthz`` and another workspace's tool list while it is still unanswered
(docs/security.md, "Parsing untrusted code")."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import serving
from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

FSTRING = "def main(**p):\n    return {'message': f'" + "{1=}" * 65_000 + "'}\n"
BRACKETS = "function main(p) { return " + "([{" * 87_000 + "}\n"
SLOW = {"python": FSTRING, "javascript": BRACKETS}
ROUNDS = 10
WAIT_S = 60.0  # for the slow request's answer: generous, this is no timing assertion


class BodyRead:
    """ASGI middleware: ``read`` is set once the app has received the whole body of a request
    that carries the header ``x-watch`` (the service starts on it from there)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.read = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watched = scope["type"] == "http" and any(k == b"x-watch" for k, _ in scope["headers"])
        if not watched:
            await self.app(scope, receive, send)
            return

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body"):
                self.read.set()
            return message

        await self.app(scope, receiving, send)


@pytest.fixture(scope="module")
def served(target: Target) -> Iterator[tuple[str, BodyRead]]:
    made: list[BodyRead] = []

    def wrap(app: Any) -> BodyRead:
        made.append(BodyRead(app))
        return made[0]

    with serving(target.runtime, wrap) as base:
        yield base, made[0]


@pytest.fixture(scope="module")
def attacker(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "parse-attacker")


@pytest.fixture(scope="module")
def bystander(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "parse-bystander")


def _tool(t: Tenant, language: str, code: str) -> dict[str, Any]:
    return {
        "workspace_id": t.workspace_id,
        "name": "slow-to-parse",
        "language": language,
        "code": code,
        "input_schema": {"type": "object"},
    }


def _slow(language: str, case: str) -> str:
    """The slow text of ``language``, made this case's own: a text analysed before is
    answered from the workspace's analyses at once (services/analysis.py)."""
    return SLOW[language] + ("# " if language == "python" else "// ") + case + "\n"


def _request(endpoint: str, t: Tenant, language: str, code: str) -> tuple[str, dict[str, Any]]:
    if endpoint == "run-code":
        return "/v1/run-code", {"language": language, "code": code, "input": {}}
    path = {"validate": "/validate", "create": "", "test": "/test"}[endpoint]
    body = _tool(t, language, code)
    if endpoint == "test":
        body["input"] = {}
    return f"/v1/custom-tools{path}", body


def _answered_meanwhile(
    base: str,
    watch: BodyRead,
    slow: tuple[str, dict[str, Any]],
    headers: dict[str, str],
    by: Tenant,
) -> httpx.Response:
    """Send ``slow``; once the service has read it, ROUNDS answers from /healthz and the
    bystander's list must come while it is unanswered. Returns its answer."""
    answer: list[httpx.Response] = []
    done = threading.Event()
    watch.read.clear()

    def send() -> None:
        try:
            with httpx.Client(base_url=base, timeout=WAIT_S) as c:
                answer.append(c.post(slow[0], json=slow[1], headers={**headers, "x-watch": "1"}))
        finally:
            done.set()

    threading.Thread(target=send, daemon=True).start()
    assert watch.read.wait(WAIT_S), "the service never read the request"
    with httpx.Client(base_url=base, timeout=WAIT_S) as other:
        for i in range(ROUNDS):
            assert other.get("/healthz").status_code == 200
            listed = other.get(
                f"/v1/custom-tools?workspace_id={by.workspace_id}", headers=by.headers
            )
            assert listed.status_code == 200
            assert not done.is_set(), f"the service answered others only {i} times meanwhile"
    assert done.wait(WAIT_S), "the slow request was never answered"
    return answer[0]


@pytest.mark.parametrize("language", ["python", "javascript"])
@pytest.mark.parametrize("endpoint", ["validate", "create", "test"])
def test_code_slow_to_parse_is_refused_while_others_are_served(
    served: tuple[str, BodyRead], attacker: Tenant, bystander: Tenant, endpoint: str, language: str
) -> None:
    base, watch = served
    slow = _request(endpoint, attacker, language, _slow(language, endpoint))
    r = _answered_meanwhile(base, watch, slow, attacker.headers, bystander)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_tool"
    assert [p["field"] for p in error["details"]] == ["code"]
    if language == "python":
        assert "took longer than" in error["details"][0]["message"]


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_run_code_slow_to_parse_is_the_codes_error_while_others_are_served(
    served: tuple[str, BodyRead], attacker: Tenant, bystander: Tenant, language: str
) -> None:
    base, watch = served
    slow = _request("run-code", attacker, language, _slow(language, "run-code"))
    r = _answered_meanwhile(base, watch, slow, attacker.headers, bystander)
    assert r.status_code == 200, r.text
    result = r.json()["data"]
    assert result["status"] == "error" and result["error"]["code"] == "runtime_error", result
    if language == "python":
        assert "took longer than" in result["error"]["message"]


def test_one_workspace_cannot_take_every_checker(
    target: Target, served: tuple[str, BodyRead], attacker: Tenant, bystander: Tenant
) -> None:
    """Six slow checks at once from one workspace: two run, two wait, two are refused at
    once (429), and the bystander's ordinary tool is checked while they are in flight."""
    base, _ = served
    checks = target.runtime.checks
    assert checks is not None
    path, body = _request("validate", attacker, "python", FSTRING)
    done: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(base_url=base, timeout=WAIT_S) as c:
            done.append(c.post(path, json=body, headers=attacker.headers))

    senders = [threading.Thread(target=send, daemon=True) for _ in range(6)]
    for s in senders:
        s.start()
    deadline = time.monotonic() + WAIT_S
    while not (checks.fair.held.get(attacker.workspace_id) == checks.fair.cap and len(done) == 2):
        assert time.monotonic() < deadline, "the slow checks never filled the workspace's share"
        time.sleep(0.01)
    ok = _request("validate", bystander, "python", "def main(**p):\n    return {'message': 'x'}")
    with httpx.Client(base_url=base, timeout=WAIT_S) as c:
        r = c.post(ok[0], json={**ok[1], "name": "ordinary"}, headers=bystander.headers)
    assert r.status_code == 200, r.text
    assert len(done) == 2, "the bystander's check waited for the slow ones"
    for s in senders:
        s.join(WAIT_S)
    assert sorted(r.status_code for r in done) == [422] * 4 + [429] * 2
    refused = [r for r in done if r.status_code == 429]
    assert all(r.json()["error"]["code"] == "too_many_requests" for r in refused)
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)


def test_checkers_hold_nothing_of_the_service(target: Target, attacker: Tenant) -> None:
    """A checker is a fresh program, not a fork of the service: an empty environment (the
    service's has a secret: tests/security/conftest.py), nobody when the service is root,
    and a seccomp filter installed before any text reaches it."""
    checks = target.runtime.checks
    assert checks is not None
    path, body = _request("validate", attacker, "python", "def main(**p):\n    return {}")
    assert target.client.post(path, json=body, headers=attacker.headers).status_code == 200
    pids = checks.pids()
    assert pids
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        assert (proc / "environ").read_bytes() == b""
        assert b"toolkiln.sandbox.checker" in (proc / "cmdline").read_bytes()
        status = dict(
            line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line
        )
        assert status["Seccomp"].strip() == "2", status["Seccomp"]
        if os.geteuid() == 0:
            assert status["Uid"].split()[:3] == ["65534"] * 3, status["Uid"]


def test_a_schema_too_complex_to_check_is_refused(target: Target, attacker: Tenant) -> None:
    """Checking a schema against the 2020-12 metaschema costs ~100 steps of jsonschema per
    subschema, in the service's process: 4,000 empty properties (51 KB, under the size cap)
    held a thread 3-7 s. The check now has a budget of steps, as a value's has."""
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(4000)}}
    body = {**_tool(attacker, "python", "def main(**p):\n    return {}"), "input_schema": schema}
    r = target.client.post("/v1/custom-tools/validate", json=body, headers=attacker.headers)
    assert r.status_code == 422, r.text
    [found] = r.json()["error"]["details"]
    assert found["field"] == "input_schema" and "too complex to check" in found["message"]
