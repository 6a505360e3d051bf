"""An agent's tool list is rendered once per list version and served from memory until a
change moves the version: every kind of change is in the very next list, on SQLite and
PostgreSQL, through this service or through another one on the same database; a change in
another workspace renders nothing again (services/tool_lists.py, storage/lists_repo.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.api.test_agents import agent, tool
from tests.api.test_invoke import invoke
from tests.conftest import Space
from toolkiln.api.app import create_app
from toolkiln.app import Runtime, build
from toolkiln.config import Settings

FAILING = (
    "def main(**p):\n    if p:\n        raise RuntimeError('no')\n    return {'message': 'ok'}"
)
KINDS = ("openai", "anthropic", "mcp")


def listed(client: TestClient, a: dict, rw: dict[str, str], **params: str) -> list[str]:
    """Each entry of the agent's list as "name: description" (code mode: run_program's
    description declares every tool)."""
    r = client.get(f"/v1/agents/{a['id']}/tools", params=params, headers=rw)
    assert r.status_code == 200, r.text
    entries = [d.get("function", d) for d in r.json()["data"]]
    return [f"{e['name']}: {e['description']}" for e in entries]


def names(client: TestClient, a: dict, rw: dict[str, str]) -> list[str]:
    return [e.partition(":")[0] for e in listed(client, a, rw)]


def renders(runtime: Runtime) -> int:
    return runtime.services.agents.lists.renders


def test_a_list_is_rendered_once_until_something_changes(
    client: TestClient, runtime: Runtime, space: Space, rw: dict[str, str]
) -> None:
    a = agent(client, space, rw)
    tool(client, space, rw, name="shared", enable_globally=True)
    for fmt in KINDS:
        first = client.get(f"/v1/agents/{a['id']}/tools", params={"format": fmt}, headers=rw)
        before = renders(runtime)
        again = client.get(f"/v1/agents/{a['id']}/tools", params={"format": fmt}, headers=rw)
        assert renders(runtime) == before  # served as rendered
        assert again.status_code == 200 and again.json() == first.json()
        assert again.headers["content-type"] == "application/json"
    code = listed(client, a, rw, mode="code")
    before = renders(runtime)
    assert listed(client, a, rw, mode="code") == code and renders(runtime) == before
    # The cached answer is still behind the token and the agent's workspace.
    other = client.get(f"/v1/agents/{a['id']}/tools", headers={"Authorization": "Bearer tk_no"})
    assert other.status_code == 401


Change = Callable[[TestClient, Space, dict[str, str], dict, dict], None]


def _create(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    tool(c, s, rw, name="newcomer", enable_globally=True)


def _update(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    r = c.patch(
        f"/v1/custom-tools/{t['id']}", json={"description": "Something else entirely."}, headers=rw
    )
    assert r.status_code == 200, r.text


def _delete(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    assert c.delete(f"/v1/custom-tools/{t['id']}", headers=rw).status_code == 204


def _disable(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    assert c.post(f"/v1/custom-tools/{t['id']}/disable", headers=rw).status_code == 200


def _auto_disable(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    r = c.patch(f"/v1/custom-tools/{t['id']}", json={"code": FAILING}, headers=rw)
    assert r.status_code == 200, r.text
    listed(c, a, rw)  # the edit's version rendered and held: the failures must move it
    for _ in range(3):
        assert invoke(c, t, rw, {"order_id": "7"})["error"]["code"] == "runtime_error"


def _enable_for_agent(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    spare = next(x for x in _tools(c, s, rw) if x["name"] == "spare")
    path = f"/v1/agents/{a['id']}/custom-tools/{spare['id']}"
    assert c.put(path, headers=rw).status_code == 200


def _tools(c: TestClient, s: Space, rw: dict[str, str]) -> list[dict]:
    r = c.get("/v1/custom-tools", params={"workspace_id": s.id}, headers=rw)
    return list(r.json()["data"])


def _unpin(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    path = f"/v1/agents/{a['id']}/custom-tools/{t['id']}"
    assert c.delete(path, headers=rw).status_code == 204


def _policy(c: TestClient, s: Space, rw: dict[str, str], a: dict, t: dict) -> None:
    r = c.patch(f"/v1/workspaces/{s.id}/policy", json={"builtins": ["calculate"]}, headers=rw)
    assert r.status_code == 200, r.text


CHANGES: dict[str, Change] = {
    "tool created": _create,
    "tool updated": _update,
    "tool deleted": _delete,
    "tool disabled": _disable,
    "tool disabled after three failures": _auto_disable,
    "tool enabled for the agent": _enable_for_agent,
    "agent's enablement removed": _unpin,
    "policy changed": _policy,
}


def test_a_cached_list_reads_the_agent_and_its_version_and_no_tool(
    client: TestClient, runtime: Runtime, space: Space, rw: dict[str, str]
) -> None:
    a = agent(client, space, rw)
    tool(client, space, rw, name="shared", enable_globally=True)
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, sql: str, *_: object) -> None:
        statements.append(" ".join(sql.split()))

    def read() -> list[str]:
        statements.clear()
        sa.event.listen(runtime.database.engine, "before_cursor_execute", seen)
        try:
            listed(client, a, rw)
        finally:
            sa.event.remove(runtime.database.engine, "before_cursor_execute", seen)
        return [s for s in statements if "FROM agents" in s or "FROM tools" in s]

    assert any("FROM tools" in s for s in read())  # the first: read and rendered
    again = read()
    assert len(again) == 1 and "list_version" in again[0], again


@pytest.mark.parametrize("change", CHANGES)
def test_each_kind_of_change_is_in_the_next_list(
    client: TestClient, runtime: Runtime, space: Space, rw: dict[str, str], change: str
) -> None:
    a = agent(client, space, rw)
    t = tool(client, space, rw, name="mine")
    tool(client, space, rw, name="spare")  # enabled for no agent
    path = f"/v1/agents/{a['id']}/custom-tools/{t['id']}"
    assert client.put(path, headers=rw).status_code == 200  # an enablement change too
    views = [{"format": f} for f in KINDS] + [{"mode": "code"}, {"names": "name"}]
    held = [listed(client, a, rw, **v) for v in views]
    CHANGES[change](client, space, rw, a, t)
    before = renders(runtime)
    now = [listed(client, a, rw, **v) for v in views]
    assert all(n != h for n, h in zip(now, held, strict=True)), change
    assert renders(runtime) == before + len(views)


def test_re_enabling_a_tool_and_deleting_the_agent_are_seen(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    a = agent(client, space, rw)
    t = tool(client, space, rw, name="mine", enable_globally=True)
    assert client.post(f"/v1/custom-tools/{t['id']}/disable", headers=rw).status_code == 200
    assert f"custom_{t['id']}" not in names(client, a, rw)
    assert client.post(f"/v1/custom-tools/{t['id']}/enable", headers=rw).status_code == 200
    assert f"custom_{t['id']}" in names(client, a, rw)
    assert client.delete(f"/v1/agents/{a['id']}", headers=rw).status_code == 204
    assert client.get(f"/v1/agents/{a['id']}/tools", headers=rw).status_code == 404


def test_another_workspaces_change_renders_nothing_again(
    client: TestClient,
    runtime: Runtime,
    space: Space,
    other_space: Space,
    rw: dict[str, str],
) -> None:
    a = agent(client, space, rw)
    tool(client, space, rw, name="mine", enable_globally=True)
    mine = listed(client, a, rw)
    theirs = other_space.auth("read", "write", "invoke")
    tool(client, other_space, theirs, name="theirs", enable_globally=True)
    r = client.patch(
        f"/v1/workspaces/{other_space.id}/policy", json={"builtins": ["calculate"]}, headers=theirs
    )
    assert r.status_code == 200, r.text
    before = renders(runtime)
    assert listed(client, a, rw) == mine
    assert renders(runtime) == before
    # A list held for one workspace is never served to another's token.
    assert client.get(f"/v1/agents/{a['id']}/tools", headers=theirs).status_code == 404


@pytest.fixture
def replica(runtime: Runtime, tmp_path: Path) -> Iterator[tuple[Runtime, TestClient]]:
    """A second service on the shared runtime's database (its SQLite file, or its
    PostgreSQL database), with a cache of its own."""
    url = runtime.settings.resolved_database_url()
    rt = build(Settings(data_dir=tmp_path / "replica", database_url=url), sandbox=False)
    try:
        with TestClient(create_app(rt.services), raise_server_exceptions=False) as c:
            yield rt, c
    finally:
        rt.close()


def test_a_change_through_one_replica_is_in_the_others_next_list(
    client: TestClient, space: Space, rw: dict[str, str], replica: tuple[Runtime, TestClient]
) -> None:
    other_rt, other = replica
    a = agent(client, space, rw)
    t = tool(client, space, rw, name="mine", enable_globally=True)
    held = names(other, a, rw)
    before = renders(other_rt)
    assert names(other, a, rw) == held and renders(other_rt) == before  # B serves its own
    assert client.post(f"/v1/custom-tools/{t['id']}/disable", headers=rw).status_code == 200
    assert f"custom_{t['id']}" in held
    assert f"custom_{t['id']}" not in names(other, a, rw)  # through A, seen by B at once
    r = client.patch(f"/v1/workspaces/{space.id}/policy", json={"builtins": []}, headers=rw)
    assert r.status_code == 200, r.text
    assert names(other, a, rw) == []
