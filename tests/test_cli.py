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
    assert set(ws) == {"id", "name", "created_at"}
    issued = run(
        tmp_path, "token", "create", "--workspace", "acme", "--scopes", "read,write", "--name", "ci"
    )
    assert issued.returncode == 0, issued.stderr
    token = json.loads(issued.stdout)
    assert token["workspace_id"] == ws["id"] and token["scopes"] == ["read", "write"]
    # The shape POST /v1/tokens answers (CONTRACT 2: the CLI does the same).
    assert {"id", "token", "workspace_id", "scopes", "name", "created_at"} <= set(token)
    assert token["name"] == "ci"
    listed = run(tmp_path, "token", "list", "--workspace", "acme")
    assert token["token"] not in listed.stdout and token["id"] in listed.stdout
    (row,) = [t for t in json.loads(listed.stdout) if t["id"] == token["id"]]
    assert row["created_at"] == token["created_at"] and row["revoked"] is False

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


def run_in(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it from ``cwd``, without TOOLKILN_DATA_DIR unless given."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKILN_")}
    return subprocess.run(
        [sys.executable, "-m", "toolkiln.cli.main", *args],
        env={**full, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_commands_are_quiet_unless_they_migrate(tmp_path: Path) -> None:
    first = run(tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stderr.startswith("migrated the database to revision ")
    assert "INFO" not in first.stderr and first.stderr.count("\n") == 1
    for args in (("migrate",), ("workspace", "list"), ("token", "list")):
        again = run(tmp_path, *args)
        assert again.returncode == 0 and again.stderr == "", (args, again.stderr)


def test_database_commands_do_not_load_the_service(tmp_path: Path) -> None:
    """What makes them quick: no FastAPI, MCP SDK, sandbox or Alembic in the process."""
    code = (
        "import sys\n"
        "from toolkiln.cli.main import main\n"
        "assert main(['workspace', 'list']) == 0\n"
        "heavy = [m for m in ('fastapi', 'mcp', 'toolkiln.app', 'toolkiln.sandbox.runner',"
        " 'alembic', 'openai') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    assert run(tmp_path, "migrate").returncode == 0
    env = {**os.environ, "TOOLKILN_DATA_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout


def test_the_data_directory_is_found_from_below_the_project(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    refused = run_in(project, "workspace", "create", "found-me")
    assert refused.returncode == 2 and "no_data_dir" in refused.stderr
    assert not (project / "data").exists()
    assert run_in(project, "migrate").returncode == 0  # as `serve` would, it makes ./data
    assert (project / "data" / "toolkiln.db").is_file()
    made = run_in(project, "workspace", "create", "found-me")
    assert made.returncode == 0, made.stderr
    deeper = project / "src" / "pkg"
    deeper.mkdir(parents=True)
    listed = run_in(deeper, "workspace", "list")
    assert listed.returncode == 0, listed.stderr
    assert "found-me" in listed.stdout
    assert not (deeper / "data").exists()


def test_a_command_where_there_is_no_data_says_where_it_looked(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in (("mcp", "--agent", "nope"), ("token", "list"), ("workspace", "list")):
        proc = run_in(elsewhere, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("error: no_data_dir: ")
        assert str(elsewhere / "data") in proc.stderr and "TOOLKILN_DATA_DIR" in proc.stderr
        assert not (elsewhere / "data").exists(), args
