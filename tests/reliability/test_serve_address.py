"""The address ``toolkiln serve`` is given on its command line is the one its links name."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.reliability.harness import Serve, admin

TOKEN = "tk_address-admin-token"


def test_a_file_link_names_the_port_given_with_dash_dash_port(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "data", {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready()
    try:
        with httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=60) as http:
            made = http.post(
                "/v1/builtin-tools/surface_file/call",
                json={"input": {"filename": "a.txt", "content": "hi"}},
            )
            assert made.status_code == 200, made.text
            url = made.json()["data"]["url"]
            assert url.startswith(f"http://127.0.0.1:{serve.port}/v1/files/"), url
            assert httpx.get(url, timeout=30).content == b"hi"  # the link works as it is
    finally:
        serve.terminate()
