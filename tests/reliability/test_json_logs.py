"""``TOOLKILN_LOG_FORMAT=json``: every line ``toolkiln serve`` and its embedded runner write is
one JSON object; a line logged during a traced call carries that call's ``trace_id`` and
``span_id``; what is logged stays redacted."""

from __future__ import annotations

import io
import json
import logging
import secrets
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider

from tests.reliability.harness import Serve, admin, wait_for
from tests.reliability.otlp import Receiver
from toolkiln import logs

TOKEN = "tk_json-logs-admin-token-" + secrets.token_hex(8)
BAD = "def main(**p):\n    raise ValueError('no')\n    return {}\n"
TRACE_ID = secrets.token_hex(16)


def _lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if line.strip():
            found.append(json.loads(line))  # every line is one JSON object
    return found


def test_serve_writes_one_json_object_per_line_with_the_trace_ids(tmp_path: Path) -> None:
    receiver = Receiver()
    env = {
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        "TOOLKILN_LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
    }
    api = Serve(tmp_path / "data", env).wait_ready(120)
    try:
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        ws = http.get("/v1/workspaces").json()["data"][0]["id"]
        body = {"workspace_id": ws, "name": "broken", "language": "python", "code": BAD}
        tool = http.post("/v1/custom-tools", json=body).json()["data"]["id"]
        traceparent = f"00-{TRACE_ID}-{secrets.token_hex(8)}-01"
        for _ in range(3):  # the third failure disables it, which is logged
            http.post(
                f"/v1/custom-tools/{tool}/invoke", json={}, headers={"traceparent": traceparent}
            )

        def disabled() -> list[dict[str, Any]]:
            return [x for x in _lines(api.output()) if "was disabled" in x["message"]]

        line = wait_for("the disable's log line", disabled, 30)[0]
        assert line["level"] == "WARNING" and tool in line["message"]
        assert line["trace_id"] == TRACE_ID
        assert len(line["span_id"]) == 16 and int(line["span_id"], 16)
    finally:
        api.terminate(60)
        receiver.close()
    written = _lines(api.log.read_text())
    assert {"time", "level", "logger", "message", "trace_id", "span_id"} <= set(written[0])
    messages = " ".join(x["message"] for x in written)
    assert "runner listening on" in messages  # the embedded runner's lines are JSON too
    assert "Uvicorn running" in messages or "Started server process" in messages
    assert TOKEN not in api.log.read_text()


def test_a_json_line_is_redacted_and_names_the_current_span() -> None:
    logs.install()
    logs.protect(TOKEN)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("toolkiln.test.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tracer = TracerProvider().get_tracer("test")
    try:
        with tracer.start_as_current_span("a call") as span:
            logger.info("calling with %s", TOKEN)
            try:
                raise ValueError(f"Bearer {TOKEN}")
            except ValueError:
                logger.exception("failed")
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, failed, outside = _lines(out.getvalue())
    ids = span.get_span_context()
    assert inside["trace_id"] == f"{ids.trace_id:032x}"
    assert inside["span_id"] == f"{ids.span_id:016x}"
    assert inside["message"] == "calling with [redacted]"
    assert "ValueError" in failed["exception"] and TOKEN not in failed["exception"]
    assert outside["trace_id"] is None and outside["span_id"] is None
