"""No credential reaches a log, whichever HTTP client logs it (issue 37).

The model endpoint's URL and the search provider's carry a user and password and a token in
their path; the model and the search have API keys. A generation (one that succeeds, one
whose endpoint fails) and a search run through real servers on loopback with every logger
that could log a request (the HTTP clients', the SDK's, Toolkiln's, the root) at DEBUG:
no secret appears in any record, as formatted with its exception. The records are there
(the requests were logged, host and all), so the test would see a leak.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import own_service
from tests.model_server import ScriptedModel, fail, propose

TOKEN = "tk_log-secrets-admin-token-0000000000000"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
MODEL_USER, MODEL_PASSWORD, MODEL_PATH = "alice-llm", "pw-s3cret-9d8c7b6a", "t0k3n-5f4e3d2c1b0a"
LLM_KEY = "sk-log-test-41c3e2d1f0a9b8c7"
SEARCH_USER, SEARCH_PASSWORD, SEARCH_PATH = "bob-search", "sp-s3cret-1a2b3c4d", "st0k-6a5b4c3d2e1f"
BRAVE_KEY = "brave-key-0f9e8d7c6b5a"
BASIC = base64.b64encode(f"{MODEL_USER}:{MODEL_PASSWORD}".encode()).decode()
SECRETS = (
    BASIC,
    MODEL_USER,
    MODEL_PASSWORD,
    MODEL_PATH,
    LLM_KEY,
    SEARCH_USER,
    SEARCH_PASSWORD,
    SEARCH_PATH,
    BRAVE_KEY,
    TOKEN,
)
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "toolkiln")

TOOL = {
    "name": "echo-tool",
    "description": "Echoes.",
    "language": "python",
    "parameters": {},
    "code": "def main(**p):\n    return {'message': 'echo'}\n",
    "execution_message_description": "Echoing",
    "examples": [{"input": {}}],
}


class _Brave(BaseHTTPRequestHandler):
    """Brave's protocol under any path prefix; records the paths it was asked."""

    paths: list[str] = []

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.paths.append(self.path)
        data = json.dumps({"web": {"results": [{"title": "t", "url": "u", "description": "d"}]}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


@pytest.fixture
def brave() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Brave)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{SEARCH_USER}:{SEARCH_PASSWORD}@127.0.0.1:{server.server_address[1]}/{SEARCH_PATH}"
    server.shutdown()


def test_no_secret_reaches_a_log_at_debug(
    tmp_path: Path, brave: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ScriptedModel() as model:
        base = model.url.replace("http://", f"http://{MODEL_USER}:{MODEL_PASSWORD}@")
        base = base.replace("/v1", f"/{MODEL_PATH}/v1")
        settings = {
            "llm_base_url": base,
            "llm_model": "scripted",
            "llm_api_key": LLM_KEY,
            "llm_timeout_s": 30,
            "search_provider": "brave",
            "search_url": brave,
            "search_api_key": BRAVE_KEY,
        }
        with own_service(tmp_path, TOKEN, bootstrap_token=TOKEN, **settings) as (_, client, who):
            # Every logger that logs a request, at DEBUG: whatever the service quiets.
            caplog.set_level(logging.DEBUG)
            for name in HTTP_LOGGERS:
                caplog.set_level(logging.DEBUG, logger=name)
            model.script(propose(TOOL), fail(500))
            body = {"workspace_id": who.workspace_id, "description": "echo"}
            assert client.post("/v1/custom-tools/generate", json=body, headers=HEADERS).is_success
            failed = client.post("/v1/custom-tools/generate", json=body, headers=HEADERS)
            assert failed.status_code == 502
            found = client.post(
                "/v1/builtin-tools/web_search/call",
                json={"input": {"query": "q"}},
                headers=HEADERS,
            )
            assert found.json()["data"]["results"], found.text

    # The secrets were used: the requests went to the paths with the tokens, with the URL's
    # user and password (as httpx sends them, in place of the key's bearer header).
    assert model.requests[0].path.startswith(f"/{MODEL_PATH}/v1/")
    assert model.requests[0].headers["authorization"] == f"Basic {BASIC}"
    assert _Brave.paths and _Brave.paths[0].startswith(f"/{SEARCH_PATH}/res/v1/web/search")

    logged = [caplog.handler.format(record) for record in caplog.records]
    # The requests were logged, so a leak would have been seen.
    assert any("127.0.0.1" in line for line in logged)
    for line in logged:
        for secret in SECRETS:
            assert secret not in line, (secret, line)
