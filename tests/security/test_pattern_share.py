"""Class: slow work of one workspace cannot starve another, for a schema's regular expressions.

A tool's ``pattern`` is matched against a caller's text in processes of their own
(sandbox/patterns.py), a few for the whole service. Workspace A invoking, again and again,
its tool whose pattern backtracks without end (``^(a|a)*$`` on ``aaa…!``) holds each
process until its value's time is up; workspace B's save of a tool with any ``pattern``
(compiled there on save) and B's call with a value its pattern refuses must still be
judged on their own merit, not refused for time spent waiting behind A.

A service of the test's own on a real uvicorn; A floods from threads of the test until B's
requests are answered: the assertions are about what B is answered, never time.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import own_service, serving
from tests.security.test_slow_work import Tenant, tenant

ADMIN = "tk_pattern-share-admin-token"
FLOOD = 40  # A's calls in flight at once: fewer than A's share of the call threads
READ_S = 120.0  # a bound on one request, never an expectation
EVIL = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a|a)*$"}},
}
# Enough parts that the value's time for its patterns is the most a value may have.
EVIL_INPUT = {"s": "a" * 40 + "!", "pad": list(range(10_000))}
PLAIN = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
}
CODE = "def main(**p):\n    return {'message': 'ok'}\n"


def _create(http: httpx.Client, who: Tenant, name: str, schema: dict) -> httpx.Response:
    body = {
        "workspace_id": who.workspace_id,
        "name": name,
        "language": "python",
        "code": CODE,
        "input_schema": schema,
    }
    return http.post("/v1/custom-tools", json=body, headers=who.headers)


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[tuple[str, Tenant, Tenant]]:
    with own_service(tmp_path, ADMIN) as (rt, _, _), serving(rt) as base:
        yield base, tenant(rt), tenant(rt)


def test_a_flood_of_runaway_patterns_leaves_another_workspace_its_patterns(
    stage: tuple[str, Tenant, Tenant],
) -> None:
    base, a, b = stage
    with httpx.Client(base_url=base, timeout=READ_S) as http:
        r = _create(http, a, f"evil-{secrets.token_hex(3)}", EVIL)
        assert r.status_code == 201, r.text
        evil = r.json()["data"]["id"]
        r = _create(http, b, "plain", PLAIN)
        assert r.status_code == 201, r.text
        plain = r.json()["data"]["id"]

    stop = threading.Event()
    refused_for_time = threading.Event()

    def flood() -> None:
        with httpx.Client(base_url=base, timeout=READ_S) as http:
            while not stop.is_set():
                r = http.post(
                    f"/v1/custom-tools/{evil}/invoke",
                    json={"input": EVIL_INPUT},
                    headers=a.headers,
                )
                if "took longer" in r.text:
                    refused_for_time.set()

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOOD)]
    for t in threads:
        t.start()
    try:
        assert refused_for_time.wait(READ_S), "A's runaway pattern was never cut short"
        with httpx.Client(base_url=base, timeout=READ_S) as http:
            saved = _create(http, b, "plain-two", PLAIN)
            called = http.post(
                f"/v1/custom-tools/{plain}/invoke",
                json={"input": {"code": "abc"}},
                headers=b.headers,
            )
    finally:
        stop.set()
        for t in threads:
            t.join(READ_S)
    assert saved.status_code == 201, saved.text
    assert called.status_code == 200, called.text
    error = called.json()["data"]["error"]
    assert error["code"] == "invalid_input", error
    assert [d["field"] for d in error["details"]] == ["input.code"], error
    assert "does not match" in error["details"][0]["message"], error
