"""A secret's value reaches the server it is meant for and nothing else: no Result, no stored
call, no audit row, no log line (the root logger captured at DEBUG), no error. Both
languages, both databases."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from tests.egress.kit import Kit
from tests.egress.servers import Running


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_value_shows_nowhere(
    kit: Kit, https: Running, http: Running, language: str, caplog: pytest.LogCaptureFixture
) -> None:
    value = "sk-never-" + "7f3e9a1c5b2d"
    kit.policy(egress_private=True)
    closed = _closed_port()
    kit.secret("TOKEN", value, [f"localhost:{https.port}", f"127.0.0.1:{closed}"])
    tool = kit.tool(
        language, [f"localhost:{https.port}", f"127.0.0.1:{http.port}", f"127.0.0.1:{closed}"]
    )
    auth = {"Authorization": "Bearer {{secrets.TOKEN}}"}
    requests = [
        # sent, and echoed back by the server (in headers and in the body)
        {"method": "GET", "url": https.url("/echo", "localhost"), "headers": auth},
        # in the URL's path and query
        {
            "method": "GET",
            "url": https.url("/echo/{{secrets.TOKEN}}?k={{secrets.TOKEN}}", "localhost"),
        },
        # a redirect away: the header stays behind
        {
            "method": "GET",
            "url": https.url(f"/redirect?to={http.url('/echo')}", "localhost"),
            "headers": auth,
        },
        # refused: another host
        {"method": "GET", "url": http.url("/echo"), "headers": auth},
        # a connection that fails, with the value in the URL
        {"method": "GET", "url": f"http://127.0.0.1:{closed}/x?k={{{{secrets.TOKEN}}}}"},
    ]
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for request in requests:
            result = kit.invoke(tool, request)
            shown.append(json.dumps(result))
            stored = kit.client.get(f"/v1/tool-calls/{result['tool_call_id']}", headers=kit.rw)
            shown.append(stored.text)
    assert sum(value in str(r["headers"]) for r in https.seen.requests) == 2  # it was sent
    assert all(value not in json.dumps(r) for r in http.seen.requests)
    shown.append(json.dumps(kit.audit()))
    shown.extend(record.getMessage() for record in caplog.records)
    shown.extend(caplog.text.splitlines())
    leaks = [s[:200] for s in shown if value in s]
    assert leaks == []
    assert "{{secrets.TOKEN}}" in shown[0]  # the echo shows the placeholder instead
