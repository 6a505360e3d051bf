"""A loopback OTLP/HTTP trace receiver for tests, on the SDK's own protobuf types."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


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
