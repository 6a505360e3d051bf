"""Fixtures the sandbox tests share."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (to put in cgroup slots): killed and reaped after it. Asked
    for after the fixture that makes the slots, they are gone before it closes them."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        p.kill()
        p.wait()
