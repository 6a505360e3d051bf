"""Schemathesis (pinned in pyproject.toml) runs every check against a fresh ``toolkiln serve``
on a fresh PostgreSQL database, over real HTTP and must find nothing: no 500, no answer the document does not describe, no
schema-valid request refused, no schema-breaking request accepted, ``Allow`` on every 405.

Bounded: a fixed seed and a few examples per operation, so a run takes under a minute and
finds the same things each time. ``TOOLKILN_FUZZ_EXAMPLES`` and ``TOOLKILN_FUZZ_SEED`` widen
it by hand (docs/api.md, "Conformance").
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conformance.conftest import BIN, Served
from tests.conftest import PG_URL
from tests.reliability.harness import fresh_postgres_database

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def served_env() -> Iterator[dict[str, str]]:
    """PostgreSQL, the stricter of the two databases (no NUL in text, 32-bit integers); the
    README's walk-through (test_documented_examples) runs on SQLite."""
    with fresh_postgres_database(PG_URL) as url:
        yield {"TOOLKILN_DATABASE_URL": url}


TOOL = {
    "name": "echo",
    "language": "python",
    "code": "def main(**params):\n    return {'message': 'ok', 'rawData': params}",
    "parameters": {"text": {"type": "string", "required": False}},
}


def _seed(served: Served) -> dict[str, str]:
    """A tool, an agent and a tool call, so that paths with ids reach more than a 404."""
    auth = {"Authorization": f"Bearer {served.token}"}
    with httpx.Client(base_url=served.url, headers=auth, timeout=60) as http:
        ws = http.get("/v1/workspaces").json()["data"][0]["id"]
        tool = http.post("/v1/custom-tools", json={"workspace_id": ws, **TOOL}).json()["data"]
        agent = http.post("/v1/agents", json={"workspace_id": ws, "name": "fuzz"}).json()["data"]
        http.put(f"/v1/agents/{agent['id']}/custom-tools/{tool['id']}").raise_for_status()
        call = http.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}}).json()
    return {
        "workspaces": ws,
        "tools": tool["id"],
        "agents": agent["id"],
        "calls": call["data"]["tool_call_id"],
    }


def _config(served: Served, ids: dict[str, str]) -> Path:
    """The checked-in settings plus the seeded ids, offered often but not always."""
    lines = [(HERE / "schemathesis.toml").read_text(), "[parameters]"]
    bound = {
        "workspace_id": "workspaces",
        "tool_id": "tools",
        "agent_id": "agents",
        "tool_call_id": "calls",
    }
    for name, dictionary in bound.items():
        lines.append(f'"path.{name}" = {{ dictionary = "{dictionary}", probability = 0.8 }}')
    for dictionary, value in ids.items():
        lines += [f"[dictionaries.{dictionary}]", f'values = ["{value}"]']
    path = served.data_dir.parent / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_schemathesis_finds_nothing(served: Served) -> None:
    config = _config(served, _seed(served))
    proc = subprocess.run(
        [
            str(BIN / "st"),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            f"{served.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {served.token}",
            "--max-examples",
            os.environ.get("TOOLKILN_FUZZ_EXAMPLES", "5"),
            "--seed",
            os.environ.get("TOOLKILN_FUZZ_SEED", "20261201"),
            # One worker: CPython 3.11 can fail with "AST constructor recursion depth
            # mismatch" when Schemathesis compiles patterns in several threads (gh-106905).
            "--workers",
            "1",
            "--max-failures",
            "20",
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=served.env,
        cwd=served.data_dir.parent,
    )
    log = served.data_dir.parent / "schemathesis.log"
    log.write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"full report: {log}\n{proc.stdout[-12000:]}{proc.stderr[-3000:]}"
