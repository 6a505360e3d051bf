"""A database that stops answering while a call runs is an outage, not the sandbox's failure.

The database is made to stop answering the statements a run needs by a real lock: another
session holds ``ACCESS EXCLUSIVE`` on ``tools`` for longer than the service waits for an
answer (5 s, docs/configuration.md), then lets go, so the call's own record can be written
afterwards. Without the fix both calls below were answered ``200`` with a stored
``infra_error`` "The sandbox failed: ServiceUnavailable" (seen first with connections killed
by ``pg_terminate_backend`` and with the server SIGSTOPped under load).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import PG_URL, own_service
from tests.reliability.harness import fresh_postgres_database
from toolkiln.storage.database import ANSWER_TIMEOUT_S

TOKEN = "tk_outage-in-run-admin"
HOLD_S = ANSWER_TIMEOUT_S + 1.5  # longer than one answer may take, shorter than two


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_postgres_database(PG_URL) as url:
        yield url


def _hold_tools_lock(url: str, after_s: float, hold_s: float) -> threading.Thread:
    dsn = url.replace("postgresql+psycopg://", "postgresql://")

    def hold() -> None:
        time.sleep(after_s)
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE tools IN ACCESS EXCLUSIVE MODE")
            time.sleep(hold_s)
            conn.rollback()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    return t


def _create(client: Any, ws: str, name: str, code: str, **extra: Any) -> dict[str, Any]:
    body = {"workspace_id": ws, "name": name, "code": code, "language": "python"}
    r = client.post("/v1/custom-tools", json={**body, **extra}, headers=_h())
    assert r.status_code == 201, r.text
    return r.json()["data"]


def _h() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


OUTER = """
import time
def handle(input, ctx):
    time.sleep(1.0)
    got = ctx.tools["inner"]({})
    return {"message": "inner answered", "rawData": got}
"""


def test_a_ctx_call_that_meets_an_outage_resolves_to_unavailable(
    tmp_path: Path, pg_url: str
) -> None:
    with own_service(tmp_path, TOKEN, database_url=pg_url) as (_, client, who):
        _create(client, who.workspace_id, "inner", "def main(**p):\n    return {'message': 'hi'}")
        outer = _create(
            client, who.workspace_id, "outer", OUTER, input_schema={"type": "object"},
            timeout_ms=20000,
        )  # fmt: skip
        # The lock comes while outer sleeps, before its ctx call reads the inner tool.
        holder = _hold_tools_lock(pg_url, 0.4, HOLD_S)
        r = client.post(f"/v1/custom-tools/{outer['id']}/invoke", json={"input": {}}, headers=_h())
        holder.join(30)
        assert r.status_code == 200, r.text
        result = r.json()["data"]
        # The code went on with the error envelope (CONTRACT 5: a failing tool call
        # resolves to {"error": code, ...}); its call was not the sandbox's failure.
        assert result["error"] is None, result["error"]
        assert result["raw_data"]["error"] == "unavailable", result["raw_data"]


JS_SLOW = """
async function main(p) {
  const t = Date.now(); while (Date.now() - t < 2000) {}
  return {message: 'done'};
}
"""


def test_a_run_whose_admission_meets_an_outage_is_a_503(tmp_path: Path, pg_url: str) -> None:
    settings = {"database_url": pg_url, "sandbox_js_workers": 1}
    with own_service(tmp_path, TOKEN, **settings) as (_, client, who):
        # Two tools, so that the second call waits for the worker, not for the first
        # call's record (which the lock holds up as well).
        urls = {}
        for key in ("first", "second"):
            tool = _create(
                client, who.workspace_id, f"slow-{key}", JS_SLOW, language="javascript",
                input_schema={"type": "object"}, timeout_ms=20000,
            )  # fmt: skip
            urls[key] = f"/v1/custom-tools/{tool['id']}/invoke"
        warm = client.post(urls["first"], json={"input": {}}, headers=_h())
        assert warm.status_code == 200
        answers: dict[str, Any] = {}

        def call(key: str) -> None:
            answers[key] = client.post(urls[key], json={"input": {}}, headers=_h())

        first = threading.Thread(target=call, args=("first",))
        first.start()
        time.sleep(0.3)  # the second queues behind the first for the one worker
        second = threading.Thread(target=call, args=("second",))
        second.start()
        # Locked while the first runs: the second's admission (the tool's status, read
        # when the worker frees at ~2 s) waits past the answer bound.
        holder = _hold_tools_lock(pg_url, 0.5, HOLD_S + 1.0)
        for t in (first, second, holder):
            t.join(60)
        r = answers["second"]
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable"
        # Nothing of it was stored: no call record says the sandbox failed.
        calls = client.get("/v1/audit", params={"event": "tool.invoked"}, headers=_h())
        errors = [row["data"]["error"] for row in calls.json()["data"]]
        assert "infra_error" not in errors, errors
