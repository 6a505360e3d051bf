"""The ``toolkiln`` command, run as a user runs it: a real process on a real data directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from toolkiln.api.app import create_app
from toolkiln.app import build
from toolkiln.config import Settings


def run(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLKILN_DATA_DIR": str(data_dir)}
    env.pop("TOOLKILN_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "toolkiln.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_workspace_and_token_lifecycle(tmp_path: Path) -> None:
    made = run(tmp_path, "workspace", "create", "acme")
    assert made.returncode == 0, made.stderr
    ws = json.loads(made.stdout)
    issued = run(tmp_path, "token", "create", "--workspace", "acme", "--scopes", "read,write")
    assert issued.returncode == 0, issued.stderr
    token = json.loads(issued.stdout)
    assert token["workspace_id"] == ws["id"] and token["scopes"] == ["read", "write"]
    listed = run(tmp_path, "token", "list", "--workspace", "acme")
    assert token["token"] not in listed.stdout and token["id"] in listed.stdout

    runtime = build(Settings(data_dir=tmp_path))
    try:
        client = TestClient(create_app(runtime.services))
        auth = {"Authorization": f"Bearer {token['token']}"}
        assert client.get(f"/v1/workspaces/{ws['id']}", headers=auth).status_code == 200
        assert run(tmp_path, "token", "revoke", token["id"]).returncode == 0
        assert client.get(f"/v1/workspaces/{ws['id']}", headers=auth).status_code == 401
    finally:
        runtime.close()
    dup = run(tmp_path, "workspace", "create", "acme")
    assert dup.returncode == 2 and "name_taken" in dup.stderr
    bad = run(tmp_path, "token", "create", "--workspace", "acme", "--scopes", "root")
    assert bad.returncode == 2 and "validation_error" in bad.stderr


def test_bootstrap_token_makes_start_up_scriptable(tmp_path: Path) -> None:
    runtime = build(Settings(data_dir=tmp_path, bootstrap_token="boot-secret-1"))
    try:
        access = runtime.services.access
        assert access.bootstrap("boot-secret-1") is not None
        assert access.bootstrap("boot-secret-1") is None  # only while no admin token exists
        who = access.authenticate("boot-secret-1")
        assert who.is_admin
        assert [w.name for w in access.list_workspaces(who)] == ["default"]
    finally:
        runtime.close()
