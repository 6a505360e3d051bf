"""The SQLite database's disk full: writes answer 503 saying so, /healthz is 503 (so a load
balancer stops sending calls), and the service recovers by itself once space is freed.

Before, every write answered "The database is unreachable" while /healthz said ok. The disk
is a small tmpfs of the test's own (the test runs as root, as the sandbox needs anyway)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import own_service

TOKEN = "tk_disk-full-admin-token"
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    if _libc.mount(b"tmpfs", str(where).encode(), b"tmpfs", 0, b"size=24m") != 0:
        pytest.skip(f"cannot mount a tmpfs here (errno {ctypes.get_errno()})")
    try:
        yield where
    finally:
        _libc.umount2(str(where).encode(), 2)


def test_a_full_disk_is_a_503_saying_so_and_passes(small_disk: Path) -> None:
    with own_service(small_disk / "data", TOKEN) as (_, client, _who):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/healthz").status_code == 200
        filler = small_disk / "filler"
        with filler.open("wb") as out:  # until the disk refuses
            try:
                while True:
                    out.write(b"\0" * (1 << 20))
                    out.flush()
            except OSError:
                pass
        try:
            body = {"name": "full-disk-ws"}
            made = client.post("/v1/workspaces", json=body, headers=headers)
            assert made.status_code == 503, made.text
            assert made.json()["error"]["code"] == "unavailable"
            assert "disk is full" in made.json()["error"]["message"]
            health = client.get("/healthz")
            assert health.status_code == 503
            parts = {d["part"]: d["reason"] for d in health.json()["degraded"]}
            assert "disk is full" in parts["database"], parts
            assert client.get("/v1/workspaces", headers=headers).status_code == 200  # reads go on
        finally:
            os.unlink(filler)
        assert client.get("/healthz").status_code == 200
        again = client.post("/v1/workspaces", json={"name": "full-disk-ws"}, headers=headers)
        assert again.status_code == 201, again.text
