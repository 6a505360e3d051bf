"""A tool's schema never makes the service send a request (a review found
jsonschema fetching a remote ``$ref`` over HTTP while validating an input: a request to any
address, on demand, from inside the platform's network).

Attack: save tools whose input schemas name a loopback HTTP server in a ``$ref`` (directly,
and behind a local pointer into a value), invoke them, test them unsaved, and call a built-in
through ``ctx`` from one; the server must see no request, and each input the reference applies
to is refused as ``invalid_input``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.security.conftest import Target
from tests.security.tenants import tenant


class _Counting(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        _Counting.hits.append(self.path)
        body = b'{"type": "integer"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def schema_url() -> Iterator[str]:
    _Counting.hits.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json"
    finally:
        server.shutdown()
        server.server_close()


def _schemas(url: str) -> list[dict[str, Any]]:
    return [
        {"type": "object", "properties": {"n": {"$ref": url}}},
        {"type": "object", "default": {"$ref": url}, "properties": {"n": {"$ref": "#/default"}}},
    ]


CODE = "def main(**params):\n    return {'message': 'ran'}\n"


def test_an_invoked_tool_s_schema_sends_no_request(target: Target, schema_url: str) -> None:
    t = tenant(target.runtime, target.client, "schema-requests")
    for i, schema in enumerate(_schemas(schema_url)):
        tool_id = t.tool(f"remote-ref-{i}", CODE, language="python", input_schema=schema)
        refused = t.invoke(tool_id, {"n": 5})
        assert refused["status"] == "error", refused
        assert refused["error"]["code"] == "invalid_input"
        assert schema_url in refused["error"]["details"][0]["message"]
        assert t.invoke(tool_id, {})["status"] == "ok"  # nothing the reference applies to
    assert _Counting.hits == []


def test_a_tested_draft_s_schema_sends_no_request(target: Target, schema_url: str) -> None:
    for schema in _schemas(schema_url):
        body = {
            "workspace_id": target.workspace_id,
            "name": "remote-ref-draft",
            "language": "python",
            "code": CODE,
            "input_schema": schema,
            "input": {"n": 5},
        }
        r = target.client.post("/v1/custom-tools/test", json=body, headers=target.headers)
        assert r.status_code == 200, r.text
        assert r.json()["data"]["error"]["code"] == "invalid_input"
    assert _Counting.hits == []
