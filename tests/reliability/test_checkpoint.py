"""SQLite's WAL is copied back into the database by a background loop of the service, not by
the commit of whichever call crosses SQLite's default 1000 pages (that call paid the copy
and two fsyncs: a p99 spike). What the loop copied is in the main database file: read here
from a copy of that file alone, without its WAL."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

from fastapi.testclient import TestClient

from toolkiln.app import Runtime, build, build_app
from toolkiln.config import Settings
from toolkiln.storage.database import WAL_BACKSTOP_PAGES

TOKEN = "tk_checkpoint-suite-admin-token"
CALLS = 20


def _in_main_file(data_dir: Path, tmp: Path) -> int:
    """builtin.called rows the main database file holds, its WAL left out."""
    copy = tmp / "main-only.db"
    shutil.copyfile(data_dir / "toolkiln.db", copy)
    conn = sqlite3.connect(copy)
    try:
        row = conn.execute("SELECT count(*) FROM audit WHERE event = 'builtin.called'").fetchone()
    except sqlite3.OperationalError:  # not even the schema is in the main file yet
        row = (0,)
    finally:
        conn.close()
    copy.unlink()
    return int(row[0])


def _calculate(client: TestClient) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(CALLS):
        r = client.post(
            "/v1/builtin-tools/calculate/call",
            json={"input": {"expression": "1+1"}},
            headers=headers,
        )
        assert r.status_code == 200, r.text


def _runtime(data_dir: Path) -> Runtime:
    rt = build(Settings(data_dir=data_dir), sandbox=False)
    rt.services.access.bootstrap(TOKEN)
    return rt


def test_the_service_checkpoints_the_wal_in_the_background(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    rt = _runtime(data_dir)
    try:
        with TestClient(build_app(rt, close_on_exit=False)) as client:
            _calculate(client)
            deadline = time.monotonic() + 10
            while _in_main_file(data_dir, tmp_path) < CALLS:
                assert time.monotonic() < deadline, "the WAL was not checkpointed"
                time.sleep(0.05)
            loops = client.get("/healthz").json()["background"]
            assert loops["storage.checkpoint"]["status"] == "ok", loops
    finally:
        rt.close()


def test_without_the_loop_a_few_writes_stay_in_the_wal(tmp_path: Path) -> None:
    """The control: no lifespan, no loop; SQLite's own checkpoint waits for the backstop."""
    data_dir = tmp_path / "data"
    rt = _runtime(data_dir)
    try:
        client = TestClient(build_app(rt, close_on_exit=False))  # no `with`: no lifespan
        _calculate(client)
        time.sleep(1)
        assert _in_main_file(data_dir, tmp_path) == 0
        with rt.database.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
        assert pages == WAL_BACKSTOP_PAGES
        assert rt.database.checkpoint() is not None
        assert _in_main_file(data_dir, tmp_path) == CALLS
    finally:
        rt.close()
