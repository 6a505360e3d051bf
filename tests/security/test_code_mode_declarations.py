"""Class: one request cannot make the service work without bound on a tool's schema.

In code mode an agent is offered one ``run_program`` tool whose description declares each
tool's parameters, made from the tool's JSON Schema in the API's process at every listing.
A schema whose every level lists all seven types beside ``properties`` had the properties
declared again for each type: 7 to the power of the depth (6.4 KB of schema made 18 MB of
declarations and ~6 s of CPU per listing; a 64 KB schema ~180 MB and a minute). The
declarations grow with the schema, not with a power of it, in both languages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import own_service

ADMIN = "tk_code-mode-declarations-admin"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
TYPES = ["array", "boolean", "integer", "null", "number", "object", "string"]


def _level(depth: int) -> dict[str, Any]:
    if depth == 0:
        return {"type": "string"}
    return {"type": TYPES, "properties": {"a": _level(depth - 1)}}


SCHEMA = {"type": "object", "properties": {f"p{i}": _level(6) for i in range(10)}}


@pytest.mark.parametrize("language", ["javascript", "python"])
def test_declarations_grow_with_the_schema(tmp_path: Path, language: str) -> None:
    with own_service(tmp_path, ADMIN) as (_, client, who):
        ws = who.workspace_id
        tool = {
            "workspace_id": ws,
            "name": "wide",
            "language": "python",
            "code": "def main(**p):\n    return {'message': 'ok'}\n",
            "input_schema": SCHEMA,
            "enable_globally": False,
        }
        r = client.post("/v1/custom-tools", json=tool, headers=HEADERS)
        assert r.status_code == 201, r.text
        tool_id = r.json()["data"]["id"]
        r = client.post("/v1/agents", json={"workspace_id": ws, "name": "a"}, headers=HEADERS)
        assert r.status_code == 201, r.text
        agent = r.json()["data"]["id"]
        r = client.put(f"/v1/agents/{agent}/custom-tools/{tool_id}", headers=HEADERS)
        assert r.status_code == 200, r.text
        r = client.get(
            f"/v1/agents/{agent}/tools?format=openai&mode=code&language={language}",
            headers=HEADERS,
        )
        assert r.status_code == 200, r.text[:300]
    (program,) = r.json()["data"]
    described = json.dumps(program)
    assert "wide" in described
    assert len(described) < 20 * len(json.dumps(SCHEMA)), len(described)
