"""Auto-disable happens once per transition, decided when each run starts (issue 11).

The race is made deterministic with a real search provider on loopback that holds one
request until the test lets it go: a slow call is admitted and held inside its run while
three fast failures disable the tool, then it succeeds late, then three more calls come.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import PG_URL, own_service
from tests.reliability.harness import fresh_postgres_database

TOKEN = "tk_reliability-race-admin"
WAIT_S = 30  # an upper bound for the gate, never reached when things work


class Gate:
    """A SearXNG-shaped endpoint whose answers wait until ``release``."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.released = threading.Event()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                gate.arrived.set()
                gate.released.wait(WAIT_S)
                body = json.dumps({"results": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.close()


CODE = """
def handle(input, ctx):
    if input.get("mode") == "slow":
        ctx.tools.web_search({"query": "held"})
        return {"message": "late success"}
    raise ValueError("fast failure")
"""


def test_one_disable_per_transition_and_a_late_success_changes_nothing(
    tmp_path: Path, gate: Gate
) -> None:
    with own_service(tmp_path, TOKEN, search_provider="searxng", search_url=gate.url) as (
        _,
        client,
        who,
    ):
        h = {"Authorization": f"Bearer {TOKEN}"}
        tool = _create(client, who.workspace_id, "flaky", "python", CODE)
        url = f"/v1/custom-tools/{tool['id']}/invoke"

        def call(mode: str) -> dict[str, Any]:
            r = client.post(url, json={"input": {"mode": mode}}, headers=h)
            assert r.status_code == 200, r.text
            return r.json()["data"]

        slow: dict[str, Any] = {}
        held = threading.Thread(target=lambda: slow.update(call("slow")))
        held.start()
        assert gate.arrived.wait(WAIT_S), "the slow call never reached its provider"
        fast = [call("fail") for _ in range(3)]
        assert [r["error"]["code"] for r in fast] == ["runtime_error"] * 3
        gate.released.set()
        held.join(WAIT_S)
        assert slow["status"] == "ok" and slow["message"] == "late success"
        after = [call("fail") for _ in range(3)]
        assert [r["error"]["code"] for r in after] == ["tool_disabled"] * 3

        state = client.get(f"/v1/custom-tools/{tool['id']}", headers=h).json()["data"]
        assert state["status"] == "disabled"
        # The late success ran, so it is usage; it does not undo the failures that
        # disabled the tool, and the refused calls never ran.
        assert state["usage_count"] == 4 and state["failure_count"] == 3
        rows = client.get(
            "/v1/audit", params={"tool_id": tool["id"], "event": "tool.disabled"}, headers=h
        ).json()["data"]
        assert len(rows) == 1 and rows[0]["data"]["failure_count"] == 3

        # Re-enabled, it starts from zero and needs three new failures.
        client.post(f"/v1/custom-tools/{tool['id']}/enable", headers=h)
        again = [call("fail") for _ in range(3)]
        assert [r["error"]["code"] for r in again] == ["runtime_error"] * 3
        rows = client.get(
            "/v1/audit", params={"tool_id": tool["id"], "event": "tool.disabled"}, headers=h
        ).json()["data"]
        assert len(rows) == 2


JS_FAILING = """
async function main(p) {
  const t = Date.now(); while (Date.now() - t < 300) {}
  if (p.never) return {message: 'unreached'};
  throw new Error('slow failure');
}
"""


@pytest.mark.parametrize("backend_url", ["sqlite", "postgresql"])
def test_calls_queued_behind_the_disabling_failure_are_not_run(
    tmp_path: Path, backend_url: str
) -> None:
    # One JavaScript worker: six calls at once run one after another. The third failure
    # disables the tool, so the three queued behind it must not run (CONTRACT 4). The
    # fourth took the worker the moment the third's run ended, before the third's record
    # (the disable) was committed, and ran: four failures, one of them after the tool was
    # disabled (reproduced with two replicas on PostgreSQL, and in process).
    settings: dict[str, Any] = {"sandbox_js_workers": 1}
    with contextlib.ExitStack() as stack:
        if backend_url == "postgresql":
            settings["database_url"] = stack.enter_context(fresh_postgres_database(PG_URL))
        _, client, who = stack.enter_context(own_service(tmp_path, TOKEN, **settings))
        h = {"Authorization": f"Bearer {TOKEN}"}
        tool = _create(client, who.workspace_id, "slow-failure", "javascript", JS_FAILING)
        url = f"/v1/custom-tools/{tool['id']}/invoke"
        codes: list[str] = []

        def call() -> None:
            r = client.post(url, json={"input": {}}, headers=h)
            assert r.status_code == 200, r.text
            codes.append(r.json()["data"]["error"]["code"])

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(codes) == ["runtime_error"] * 3 + ["tool_disabled"] * 3, codes
        state = client.get(f"/v1/custom-tools/{tool['id']}", headers=h).json()["data"]
        assert (state["status"], state["usage_count"], state["failure_count"]) == (
            "disabled",
            3,
            3,
        )


def _create(client: TestClient, workspace_id: str, name: str, language: str, code: str) -> dict:
    """A tool taking any object, with time enough for every call the tests queue."""
    body = {
        "workspace_id": workspace_id,
        "name": name,
        "language": language,
        "code": code,
        "input_schema": {"type": "object"},
        "timeout_ms": 20000,
    }
    r = client.post("/v1/custom-tools", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201, r.text
    return dict(r.json()["data"])
