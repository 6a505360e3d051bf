"""Workspace secrets (CONTRACT 14): written, listed without values, changed, deleted; sealed
at rest under a key ring; SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.egress.kit import Kit
from tests.egress.servers import Running
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.storage.sealing import KeyRing, new_key, parse_key
from toolkiln.storage.tables import workspace_secrets


def test_create_list_change_delete(kit: Kit) -> None:
    base = f"/v1/workspaces/{kit.space.id}/secrets"
    made = kit.secret("API_KEY", "sk-crud-0123456789", ["api.example.com"])
    assert set(made) == {"name", "hosts", "created_at", "updated_at", "last_used_at"}
    assert made["hosts"] == ["api.example.com"] and made["last_used_at"] is None
    listed = kit.client.get(base, headers=kit.space.auth("read")).json()["data"]
    assert listed == [made]
    again = kit.client.post(
        base, json={"name": "API_KEY", "value": "x", "hosts": ["a.com"]}, headers=kit.rw
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "name_taken"
    patched = kit.client.patch(
        f"{base}/API_KEY", json={"hosts": ["*.example.com"], "value": "new"}, headers=kit.rw
    )
    assert patched.status_code == 200 and patched.json()["data"]["hosts"] == ["*.example.com"]
    assert "value" not in patched.json()["data"]
    assert kit.client.delete(f"{base}/API_KEY", headers=kit.rw).status_code == 204
    assert kit.client.delete(f"{base}/API_KEY", headers=kit.rw).status_code == 404
    rows = [r["event"] for r in kit.audit() if r["event"].startswith("secret.")]
    assert rows == ["secret.created", "secret.updated", "secret.deleted"]


def test_bad_secrets_are_422_naming_the_field(kit: Kit) -> None:
    base = f"/v1/workspaces/{kit.space.id}/secrets"
    r = kit.client.post(
        base, json={"name": "OK", "value": "line\nbreak", "hosts": ["a b"]}, headers=kit.rw
    )
    assert r.status_code == 422
    fields = {p["field"] for p in r.json()["error"]["details"]}
    assert fields == {"value", "hosts.0"}
    r = kit.client.post(base, json={"name": "1x", "value": "v", "hosts": ["a.com"]}, headers=kit.rw)
    assert r.status_code == 422


def test_who_may_touch_secrets(kit: Kit, other_space_of_kit: str) -> None:
    base = f"/v1/workspaces/{kit.space.id}/secrets"
    body = {"name": "K", "value": "v", "hosts": ["a.com"]}
    assert kit.client.post(base, json=body, headers=kit.space.auth("read")).status_code == 403
    assert kit.client.post(base, json=body, headers=kit.space.auth("admin")).status_code == 201
    theirs = f"/v1/workspaces/{other_space_of_kit}/secrets"
    assert kit.client.get(theirs, headers=kit.rw).status_code == 404
    assert kit.client.post(theirs, json=body, headers=kit.rw).status_code == 404


@pytest.fixture
def other_space_of_kit(kit: Kit) -> str:
    from tests.conftest import make_space

    return make_space(kit.runtime).id


def test_values_are_sealed_at_rest(kit: Kit) -> None:
    value = "sk-at-rest-5566778899"
    kit.secret("SEALED", value, ["a.com"])
    with kit.runtime.database.engine.connect() as conn:
        row = (
            conn.execute(
                sa.select(workspace_secrets).where(workspace_secrets.c.workspace_id == kit.space.id)
            )
            .mappings()
            .one()
        )
    assert value not in str(dict(row)) and row["sealed"].startswith("v1.")


def test_last_used_at_moves_when_a_request_sends_it(kit: Kit, http: Running) -> None:
    kit.policy(egress_private=True)
    kit.secret("USED", "sk-used-1122334455", [f"127.0.0.1:{http.port}"])
    tool = kit.tool("python", [f"127.0.0.1:{http.port}"])
    got = kit.answer(
        tool, {"method": "GET", "url": http.url("/json"), "headers": {"K": "{{secrets.USED}}"}}
    )
    assert got["status"] == 200
    base = f"/v1/workspaces/{kit.space.id}/secrets"
    listed = kit.client.get(base, headers=kit.rw).json()["data"]
    assert listed[0]["last_used_at"] is not None


def test_a_key_ring_opens_what_older_keys_sealed() -> None:
    old, new = parse_key(new_key()), parse_key(new_key())
    sealed = KeyRing([old]).seal("value", "ws/NAME")
    rotated = KeyRing([new, old])
    assert rotated.open(sealed, "ws/NAME") == "value"
    assert rotated.seal("value", "ws/NAME").split(".")[1] != sealed.split(".")[1]
    with pytest.raises(ServiceUnavailable):
        KeyRing([new]).open(sealed, "ws/NAME")
    with pytest.raises(ServiceUnavailable):  # moved to another row: it does not open
        rotated.open(sealed, "other-ws/NAME")
