"""The documented examples run as written, against a real ``toolkiln serve``.

A fenced block right after a ``<!-- doc-test -->`` line in README.md or docs/*.md is an
example that must work:

- ``sh``: the blocks of one page run in order, in one ``bash -euo pipefail`` session, with
  the page's service at ``localhost:8080`` (the test's own port is put in its place) and the
  CLI on the service's data directory. Every ``curl`` must get a 2xx unless the block's
  next comment line says what it answers (``# 422 {...}``).
- ``python`` / ``js`` tool code, marked ``<!-- doc-test {"input": {...}} -->``: run once by
  ``POST /v1/custom-tools/test`` with the parameters of the page's last ``json`` block
  marked ``<!-- doc-test parameters -->`` (the last one before it, else the page's first);
  its Result must be ``ok``.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import BIN, Served
from tests.conftest import ROOT

MARK = re.compile(
    r"^<!-- doc-test(?P<arg>[^\n]*?)-->\n```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S
)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ADMIN = "dev-admin-token"  # the README starts the service with this bootstrap token


@dataclass(frozen=True)
class Example:
    page: Path
    lang: str
    arg: str
    body: str
    line: int


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    return [
        Example(page, m["lang"], m["arg"].strip(), m["body"], text[: m.start()].count("\n") + 1)
        for m in MARK.finditer(text)
    ]


ALL = [e for page in PAGES for e in examples(page)]


@pytest.fixture(scope="module")
def served_token() -> str:
    return ADMIN


def test_the_readme_has_runnable_examples() -> None:
    readme = [e for e in ALL if e.page.name == "README.md"]
    assert len(readme) >= 6 and all(e.lang == "sh" for e in readme)


def _shell_script(blocks: list[Example], served: Served) -> str:
    host = served.url.removeprefix("http://")
    out = ["set -euo pipefail", _CURL_CHECK]
    for block in blocks:
        body = block.body.replace("localhost:8080", host).replace("127.0.0.1:8080", host)
        body = body.replace(".venv/bin/", f"{BIN}/")
        out.append(f"echo '--- {block.page.name}:{block.line}' >&2")
        out.append(body)
    return "\n".join(out)


# Every curl of an example must succeed (2xx), unless it is the README's refused example,
# which says on its next line what it answers.
_CURL_CHECK = r"""
curl() {
  local out status
  out=$(command curl -w '\n%{http_code}' "$@")
  status=${out##*$'\n'}
  printf '%s\n' "${out%$'\n'*}"
  case "$status" in
    2??) ;;
    422) [[ "${DOC_TEST_EXPECT:-}" == 422 ]] || { echo "curl answered 422" >&2; return 1; } ;;
    *) echo "curl answered $status" >&2; return 1 ;;
  esac
}
"""


@pytest.mark.parametrize(
    "page", sorted({e.page for e in ALL if e.lang == "sh"}), ids=lambda p: p.name
)
def test_documented_shell_examples_run_as_written(served: Served, page: Path) -> None:
    blocks = [e for e in ALL if e.page == page and e.lang == "sh"]
    script = _shell_script(
        [Example(b.page, b.lang, b.arg, _expect_refusal(b.body), b.line) for b in blocks],
        served,
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**served.env, "DOC_TEST_EXPECT": ""},
    )
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n--- stdout\n{proc.stdout[-4000:]}"
    if page.name == "README.md":  # the walk-through got to its end
        assert "result: Order A-17 is delivered" in proc.stdout, proc.stdout[-4000:]


def _expect_refusal(body: str) -> str:
    """A block whose comment says ``# 422 ...`` may get that answer from its curl."""
    if re.search(r"^# 422 ", body, re.M):
        return f"DOC_TEST_EXPECT=422\n{body}\nDOC_TEST_EXPECT=\n"
    return body


TOOL_EXAMPLES = [e for e in ALL if e.lang in ("python", "js")]


def test_there_are_tool_code_examples_to_run() -> None:
    assert {e.lang for e in TOOL_EXAMPLES} == {"python", "js"}


@pytest.mark.parametrize("example", TOOL_EXAMPLES, ids=lambda e: f"{e.page.name}:{e.line}")
def test_documented_tool_code_runs(served: Served, example: Example) -> None:
    spec: dict[str, Any] = json.loads(example.arg or "{}")
    blocks = examples(example.page)
    params = [b for b in blocks if b.arg == "parameters"]
    before = [b for b in params if b.line < example.line]
    chosen = before[-1] if before else (params[0] if params else None)
    body = {
        "name": "doc-example",
        "language": "python" if example.lang == "python" else "javascript",
        "code": example.body,
        "parameters": json.loads(chosen.body) if chosen else None,
        "input": spec.get("input", {}),
    }
    with httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=120
    ) as http:
        ws = http.get("/v1/workspaces").json()["data"][0]["id"]
        r = http.post("/v1/custom-tools/test", json={"workspace_id": ws, **body})
    assert r.status_code == 200, r.text
    result = r.json()["data"]
    assert result["status"] == "ok", result


def test_the_mcp_client_configurations_name_their_transport() -> None:
    """MCP clients such as the official Inspector refuse a server entry without its type."""
    shown = [json.loads((ROOT / "examples" / "mcp_client_config.json").read_text())]
    agents = (ROOT / "docs" / "agents.md").read_text()
    shown += [
        json.loads(m) for m in re.findall(r"```json\n(\{\n  \"mcpServers\".*?)```", agents, re.S)
    ]
    assert len(shown) == 2
    for config in shown:
        for name, server in config["mcpServers"].items():
            kind = server.get("type")
            assert kind in ("streamable-http", "stdio"), name
            assert ("url" in server) == (kind == "streamable-http"), name
            assert ("command" in server) == (kind == "stdio"), name
