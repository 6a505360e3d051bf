"""A service whose http_request trusts a test CA, per database, and loopback servers: the
fixtures of the egress tests and of their attack tests (tests/security/test_egress_*.py)."""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from fastapi.testclient import TestClient

from tests.conftest import Space, make_space
from tests.egress.servers import Running, server
from toolkiln.api.app import create_app
from toolkiln.app import Runtime, build
from toolkiln.config import Settings

PY_TOOL = (
    "def main(*, ctx, **params):\n"
    "    return {'message': 'done', 'rawData': ctx.tools.http_request(params['request'])}\n"
)
JS_TOOL = (
    "export async function handle(input, ctx) {\n"
    "  return { message: 'done', rawData: await ctx.tools.http_request(input.request) };\n"
    "}\n"
)
TOOLS = {"python": PY_TOOL, "javascript": JS_TOOL}


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def egress_runtime(
    backend: str,
    ca: trustme.CA,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Runtime]:
    data_dir = tmp_path_factory.mktemp(f"egress-{backend}")
    pem = data_dir / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    url = None if backend == "sqlite" else request.getfixturevalue("postgres_url")
    rt = build(Settings(data_dir=data_dir, database_url=url, egress_ca_file=Path(pem)))
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def egress_client(egress_runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(egress_runtime.services), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def https(ca: trustme.CA) -> Iterator[Running]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    with server(context) as running:
        yield running


@pytest.fixture
def http() -> Iterator[Running]:
    with server() as running:
        yield running


@pytest.fixture
def other() -> Iterator[Running]:
    """A server no request in the test is allowed to reach."""
    with server() as running:
        yield running


@dataclass
class Kit:
    """A workspace of the egress service, and what its tests do with it."""

    client: TestClient
    space: Space
    runtime: Runtime

    @property
    def rw(self) -> dict[str, str]:
        return self.space.auth("read", "write", "invoke")

    def policy(self, **change: Any) -> None:
        url = f"/v1/workspaces/{self.space.id}/policy"
        r = self.client.patch(url, json=change, headers=self.space.auth("admin"))
        assert r.status_code == 200, r.text

    def secret(self, name: str, value: str, hosts: list[str]) -> dict[str, Any]:
        url = f"/v1/workspaces/{self.space.id}/secrets"
        body = {"name": name, "value": value, "hosts": hosts}
        r = self.client.post(url, json=body, headers=self.rw)
        assert r.status_code == 201, r.text
        return dict(r.json()["data"])

    def tool(self, language: str, egress: list[str]) -> str:
        body = {
            "workspace_id": self.space.id,
            "name": f"fetch-{secrets.token_hex(4)}",
            "language": language,
            "code": TOOLS[language],
            "input_schema": {"type": "object"},
            "egress": egress,
        }
        r = self.client.post("/v1/custom-tools", json=body, headers=self.rw)
        assert r.status_code == 201, r.text
        return str(r.json()["data"]["id"])

    def invoke(self, tool_id: str, request: dict[str, Any]) -> dict[str, Any]:
        url = f"/v1/custom-tools/{tool_id}/invoke"
        r = self.client.post(url, json={"input": {"request": request}}, headers=self.rw)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    def answer(self, tool_id: str, request: dict[str, Any]) -> Any:
        """What ``ctx.tools.http_request`` resolved to in the tool's code."""
        result = self.invoke(tool_id, request)
        assert result["status"] == "ok", result
        return result["raw_data"]

    def audit(self, event: str | None = None) -> list[dict[str, Any]]:
        q = f"/v1/audit?workspace_id={self.space.id}&limit=200"
        rows = self.client.get(q, headers=self.space.auth("admin")).json()["data"]
        return [r for r in rows if event is None or r["event"] == event]


@pytest.fixture
def kit(egress_runtime: Runtime, egress_client: TestClient) -> Kit:
    return Kit(egress_client, make_space(egress_runtime), egress_runtime)


@pytest.fixture(params=["python", "javascript"])
def language(request: pytest.FixtureRequest) -> str:
    return str(request.param)
