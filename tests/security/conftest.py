"""A service of the security suite's own (SQLite), with the sandbox at full strength."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import own_service
from tests.egress.kit import (  # noqa: F401  (the egress attack tests' fixtures)
    ca,
    egress_client,
    egress_runtime,
    http,
    kit,
)
from toolkiln.app import Runtime

SECRET = "tk_security-suite-secret-never-visible"


@dataclass
class Target:
    runtime: Runtime
    client: TestClient
    headers: dict[str, str]
    workspace_id: str
    data_dir: Path

    def run(
        self,
        code: str,
        payload: Any = None,
        timeout_ms: int = 2000,
        name: str = "attack",
        language: str = "python",
    ) -> dict:
        body = {
            "workspace_id": self.workspace_id,
            "name": name,
            "language": language,
            "code": code,
            "input_schema": {"type": "object"},
            "timeout_ms": timeout_ms,
            "input": payload or {},
        }
        r = self.client.post("/v1/custom-tools/test", json=body, headers=self.headers)
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def sandbox_processes(self) -> list[int]:
        """Pids of every process running as a sandbox uid (warm children and leftovers)."""
        ranges = [
            (s.uids.first, s.uids.first + s.uids.count) for s in self.runtime.sandboxes.values()
        ]
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if any(low <= uid < high for low, high in ranges):
                found.append(int(entry.name))
        return found

    def assert_contained(self) -> None:
        """The service answers, and nothing but the warm pool runs as a sandbox uid."""
        assert self.client.get("/healthz").json()["status"] == "ok"
        deadline = time.monotonic() + 5
        while True:
            running = len(self.sandbox_processes())
            pools = [t for s in self.runtime.sandboxes.values() for t in s.templates()]
            ready = sum(t.health()["warm"] for t in pools)
            # + one per pool: a replacement may be between fork and "ready"
            if running <= ready + len(pools):
                return
            assert time.monotonic() < deadline, f"{running} sandbox processes, {ready} warm"
            time.sleep(0.02)


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    data_dir = tmp_path_factory.mktemp("security")
    os.environ["TOOLKILN_SECRET_FOR_TESTS"] = SECRET  # the service's env must stay unreachable
    with own_service(data_dir, SECRET, bootstrap_token=SECRET) as (rt, client, who):
        yield Target(rt, client, {"Authorization": f"Bearer {SECRET}"}, who.workspace_id, data_dir)
