"""A real ``toolkiln serve`` configured by the standard ``OTEL_*`` variables sends its spans
over OTLP/HTTP to a receiver on loopback: the API's and its embedded runner's, in one
trace under the caller's ``traceparent``; the exporter's header credential reaches the API's
exports only (the runner is never given it)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.reliability.harness import Serve, admin, wait_for

TOKEN = "tk_otlp-admin-token-" + secrets.token_hex(8)
COLLECTOR_KEY = "collector-key-" + secrets.token_hex(8)
TRACE_ID = secrets.token_hex(16)
CODE = {"language": "python", "code": "def main(**p):\n    return {'message': 'traced'}\n"}


class Receiver:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf), the SDK's own types."""

    def __init__(self) -> None:
        # Each span: its service, name, trace id, and the headers of the request it came in.
        self.spans: list[tuple[str, str, bytes, dict[str, str]]] = []
        received = self.spans
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest.FromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    for resource_spans in request.resource_spans:
                        service = next(
                            a.value.string_value
                            for a in resource_spans.resource.attributes
                            if a.key == "service.name"
                        )
                        for scope in resource_spans.scope_spans:
                            for span in scope.spans:
                                received.append((service, span.name, span.trace_id, headers))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
