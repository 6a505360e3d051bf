"""The SQLite backup docs/deployment.md shows, run as written while a real `toolkiln serve`
writes (calls committing the whole time), then restored as the page says: every call
committed before the backup is in the copy, and a service started on it serves it."""

from __future__ import annotations

import re
import shlex
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.reliability.harness import Serve, admin

TOKEN = "tk_backup-admin-token"
LIVE = "/var/lib/toolkiln/toolkiln.db"
COPY = "/backup/toolkiln.db"


def documented_backups() -> list[list[str]]:
    """The sqlite3 commands of the page's "Backups" section (the commented one included)."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("## Backups", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no backup commands"
    lines = [ln.removeprefix("# or, compacted: ") for ln in block.group(1).splitlines()]
    commands = [shlex.split(ln) for ln in lines if ln.startswith("sqlite3 ")]
    assert len(commands) == 2, commands
    return commands


@pytest.mark.parametrize("which", [0, 1], ids=["backup", "vacuum-into"])
def test_the_documented_sqlite_backup_holds_every_committed_call(
    tmp_path: Path, which: int
) -> None:
    data = tmp_path / "data"
    serve = Serve(data, {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready()
    stop = threading.Event()
    try:
        base, headers = serve.base, admin(TOKEN)
        ws = httpx.get(f"{base}/v1/workspaces", headers=headers).json()["data"][0]["id"]
        body = {
            "workspace_id": ws,
            "name": "backed-up",
            "language": "python",
            "code": "def main(**p):\n    return {'message': 'ok'}",
        }
        tool = httpx.post(f"{base}/v1/custom-tools", headers=headers, json=body).json()["data"]
        done: list[str] = []

        def calls() -> None:
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
                while not stop.is_set():
                    r = client.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}})
                    done.append(r.json()["data"]["tool_call_id"])

        writer = threading.Thread(target=calls)
        writer.start()
        while len(done) < 20:  # calls keep committing while the copy is made
            writer.join(0.05)
        committed = set(done)
        copy = tmp_path / "backup" / "toolkiln.db"
        copy.parent.mkdir()
        command = [
            w.replace(LIVE, str(data / "toolkiln.db")).replace(COPY, str(copy))
            for w in documented_backups()[which]
        ]
        run = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stderr
    finally:
        stop.set()
        serve.terminate()
    with sqlite3.connect(copy) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = {row[0] for row in db.execute("SELECT id FROM tool_calls")}
    assert committed <= stored
    # Restored as the page says: the copy as toolkiln.db of a data directory, no WAL beside it.
    restored = tmp_path / "restored"
    restored.mkdir()
    copy.rename(restored / "toolkiln.db")
    again = Serve(restored, {}).wait_ready()
    try:
        listed = httpx.get(f"{again.base}/v1/custom-tools/{tool['id']}", headers=admin(TOKEN))
        assert listed.status_code == 200
        assert listed.json()["data"]["usage_count"] >= len(committed)
    finally:
        again.terminate()
