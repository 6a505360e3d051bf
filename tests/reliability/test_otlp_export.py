"""A real ``toolkiln serve`` configured by the standard ``OTEL_*`` variables sends its spans
over OTLP/HTTP to a receiver on loopback: the API's and its embedded runner's, in one
trace under the caller's ``traceparent``; the exporter's header credential reaches the API's
exports only (the runner is never given it)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import Serve, admin, wait_for
from tests.reliability.otlp import Receiver

TOKEN = "tk_otlp-admin-token-" + secrets.token_hex(8)
COLLECTOR_KEY = "collector-key-" + secrets.token_hex(8)
TRACE_ID = secrets.token_hex(16)
CODE = {"language": "python", "code": "def main(**p):\n    return {'message': 'traced'}\n"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def test_spans_reach_an_otlp_receiver_named_by_the_otel_variables(
    tmp_path: Path, receiver: Receiver
) -> None:
    env = {
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-collector-key={COLLECTOR_KEY}",
        "OTEL_SERVICE_NAME": "toolkiln-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    api = Serve(tmp_path / "data", env).wait_ready(120)
    try:
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        traceparent = f"00-{TRACE_ID}-{secrets.token_hex(8)}-01"
        r = http.post("/v1/run-code", json=CODE, headers={"traceparent": traceparent})
        assert r.json()["data"]["message"] == "traced", r.text

        def names() -> set[str]:
            want = bytes.fromhex(TRACE_ID)
            return {name for _, name, trace, _ in list(receiver.spans) if trace == want}

        wait_for(
            "the API's and the runner's spans",
            lambda: {"POST /v1/run-code", "execute_tool run_code", "runner.serve"} <= names(),
            60,
        )
        assert {s for s, *_ in receiver.spans} == {"toolkiln-under-test"}
        by_runner = [h for _, name, _, h in receiver.spans if name == "runner.serve"]
        by_api = [h for _, name, _, h in receiver.spans if name == "POST /v1/run-code"]
        assert by_api[0].get("x-collector-key") == COLLECTOR_KEY
        assert "x-collector-key" not in by_runner[0]  # a runner holds no credential
    finally:
        api.terminate(60)
