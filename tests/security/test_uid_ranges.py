"""No two sandboxes on one host share a uid, whichever processes run them (sandbox/uids.py):
calls of two services never share the per-uid process limit or may signal each other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SHAPE
from toolkiln.sandbox.uids import UidRange

CLAIM = textwrap.dedent(
    """
    import sys
    from toolkiln.sandbox.uids import UidRange
    r = UidRange()
    print(r.first, flush=True)
    sys.stdin.readline()  # hold it until told
    """
)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def test_sandboxes_of_one_process_get_ranges_of_their_own() -> None:
    ranges = [UidRange() for _ in range(5)]
    try:
        spans = [(r.first, r.count) for r in ranges]
        assert not any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    finally:
        for r in ranges:
            r.release()


def test_processes_on_one_host_never_share_a_range() -> None:
    """Other processes (another replica, a test run beside a service) claim other ranges,
    and a range is free again once the process holding it is gone."""
    mine = UidRange()
    others = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    try:
        firsts = [int(p.stdout.readline()) for p in others if p.stdout is not None]
        spans = [(mine.first, mine.count)] + [(f, mine.count) for f in firsts]
        assert len(firsts) == 3
        assert not any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])
        taken = firsts[0]
        others[0].kill()  # dies holding it: the kernel drops its lock
        others[0].wait(timeout=10)
        again = UidRange()
        try:
            assert again.first <= taken  # the lowest free slot: the dead process's, or lower
        finally:
            again.release()
    finally:
        for p in others:
            if p.poll() is None:
                p.communicate("\n", timeout=10)
        mine.release()


def test_a_released_range_is_claimed_again() -> None:
    first = UidRange()
    start = first.first
    first.release()
    second = UidRange()
    try:
        assert second.first <= start  # the lowest free slot: that one (or one freed since)
    finally:
        second.release()


def test_a_slots_directory_without_its_search_bit_is_repaired() -> None:
    """Made under a umask of 0177 (the runner's socket's), the directory lacked its search bit
    and only CAP_DAC_OVERRIDE could use it: a root without it (the image's) could not start."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a root without CAP_DAC_OVERRIDE")
    if SHAPE is not None:
        pytest.skip("the host root's /run/toolkiln-uid-slots: a rootless runner's is its own")
    slots = Path("/run/toolkiln-uid-slots")
    slots.mkdir(mode=0o700, exist_ok=True)
    os.chmod(slots, 0o600)
    done = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override", sys.executable, "-c", CLAIM],
        input="\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[0]) >= 1_000_000
    assert slots.stat().st_mode & 0o777 == 0o700
