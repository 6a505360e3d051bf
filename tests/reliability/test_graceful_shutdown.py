"""SIGTERM under load: a real ``toolkiln serve`` stops taking calls, finishes the calls in
flight and writes their results, exits 0, and leaves no sandbox process behind."""

from __future__ import annotations

import signal
import sqlite3
import threading
from pathlib import Path

import httpx

from tests.reliability.harness import Serve, admin, processes_mentioning, wait_for

TOKEN = "tk_shutdown-admin-token"
IN_FLIGHT = 4
# Marks itself as started (a stored file the test can see), then works for a while.
SLOW = (
    "import time\n"
    "def handle(input, ctx):\n"
    "    ctx.tools.surface_file({'filename': 'started.txt', 'content': input['n']})\n"
    "    time.sleep(4)\n"
    "    return {'message': 'done ' + input['n']}\n"
)


def test_sigterm_finishes_calls_in_flight_and_leaves_no_sandbox(tmp_path: Path) -> None:
    data = tmp_path / "data"
    serve = Serve(
        data, {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN, "TOOLKILN_SANDBOX_WARM": str(IN_FLIGHT)}
    ).wait_ready()
    try:
        assert processes_mentioning(str(data)), "the sandbox pools should be running"
        http = httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=60)
        ws = http.get("/v1/workspaces").json()["data"][0]["id"]
        tool = http.post(
            "/v1/custom-tools",
            json={
                "workspace_id": ws,
                "name": "slow",
                "language": "python",
                "code": SLOW,
                "parameters": {"n": {"type": "string", "required": True}},
                "timeout_ms": 20000,
            },
        ).json()["data"]

        answers: dict[str, httpx.Response] = {}

        def call(n: str) -> None:
            with httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=60) as c:
                answers[n] = c.post(
                    f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {"n": n}}
                )

        calls = [threading.Thread(target=call, args=(str(i),)) for i in range(IN_FLIGHT)]
        for t in calls:
            t.start()
        db = data / "toolkiln.db"

        def started() -> int:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                return int(conn.execute("SELECT count(*) FROM files").fetchone()[0])

        wait_for("every call running", lambda: started() == IN_FLIGHT)
        serve.proc.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                httpx.get(f"{serve.base}/healthz", timeout=5)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                # Refused, or (a connection that reached the backlog as the listening socket
                # closed) reset without an answer: both are a call not taken.
                return True
            return False

        wait_for("new calls refused", refused)
        assert serve.proc.poll() is None, "it stopped taking calls before the last one ended"
        # uvicorn re-raises the signal once it has shut down, as a supervisor expects.
        assert serve.proc.wait(60) in (0, -signal.SIGTERM), serve.output()
        assert "Application shutdown complete" in serve.output()
        for t in calls:
            t.join(60)
    finally:
        serve.kill()

    assert sorted(answers) == [str(i) for i in range(IN_FLIGHT)]
    for n, r in answers.items():
        assert r.status_code == 200, r.text
        assert r.json()["data"]["status"] == "ok" and r.json()["data"]["message"] == f"done {n}"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        usage = conn.execute("SELECT usage_count FROM tools WHERE id = ?", (tool["id"],))
        assert usage.fetchone()[0] == IN_FLIGHT
        invoked = conn.execute(
            "SELECT count(*) FROM audit WHERE tool_id = ? AND event = 'tool.invoked'",
            (tool["id"],),
        )
        assert invoked.fetchone()[0] == IN_FLIGHT
    assert processes_mentioning(str(data)) == []
