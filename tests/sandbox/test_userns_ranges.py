"""Two root APIs on one host never give their embedded runners the same host ids
(``userns.embedded_range``): each holds the range it took until it closes it or dies, a range
named by TOOLKILN_SANDBOX_SUBUIDS that another holds is refused, and the default gives way
to the next free range."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkiln.config import SandboxSettings
from toolkiln.runners.local import OwnIds
from toolkiln.sandbox import userns

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the ranges of root APIs are held under root's /run"
)


@pytest.fixture
def taken() -> Iterator[list[userns.HeldRange]]:
    ranges: list[userns.HeldRange] = []
    yield ranges
    for r in ranges:
        r.close()


def _overlap(a: userns.HeldRange, b: userns.HeldRange) -> bool:
    return a.outer < b.outer + b.count and b.outer < a.outer + a.count


def test_two_defaults_are_disjoint(taken: list[userns.HeldRange]) -> None:
    taken += [userns.embedded_range(None), userns.embedded_range(None)]
    assert not _overlap(*taken)
    assert all(r.outer >= userns.DEFAULT_OUTER and r.count == userns.RANGE for r in taken)


def test_a_chosen_range_another_holds_is_refused(taken: list[userns.HeldRange]) -> None:
    taken.append(userns.embedded_range(None))
    first = taken[0]
    for start in (first.outer, first.outer + 100, first.outer - 100):
        with pytest.raises(userns.RangeHeld, match="TOOLKILN_SANDBOX_SUBUIDS"):
            userns.embedded_range(f"{start}:{userns.RANGE}")


def test_a_range_is_free_again_once_closed_or_its_holder_killed(
    taken: list[userns.HeldRange],
) -> None:
    first = userns.embedded_range(None)
    chosen = f"{first.outer}:{first.count}"
    first.close()
    taken.append(userns.embedded_range(chosen))  # closed: taken again
    taken.pop().close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from toolkiln.sandbox import userns\n"
            f"userns.embedded_range({chosen!r})\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(userns.RangeHeld):
            userns.embedded_range(chosen)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    taken.append(userns.embedded_range(chosen))  # the kernel let go of the killed holder's


def test_two_root_apis_on_one_data_directory_keep_one_runner_home(tmp_path: Path) -> None:
    """A second root process on the same data directory (``toolkiln mcp``, ``generate``
    or a second ``serve`` beside ``serve``: runners/local.py) must not take the first's
    runner directory from it: the first runner, root of a namespace of its own range, can no
    longer open its packages once ``<data>-runner`` is another range's, 0700."""
    settings = SandboxSettings(data_dir=tmp_path / "data")
    settings.data_dir.mkdir()
    first = OwnIds(settings)
    try:
        second = OwnIds(settings)
        try:
            assert os.lstat(first.home).st_uid == first.outer, (first.outer, second.outer)
        finally:
            second.close()
    finally:
        first.close()


def test_a_runner_directory_of_one_range_becomes_that_range_s(tmp_path: Path) -> None:
    """``<data>-runner`` as one range owned it (its packages in it), as an earlier version
    left it, is moved whole to ``<data>-runner/<its first id>``; the parent becomes root's,
    which others may only pass through."""
    free = userns.embedded_range(None)
    free.close()
    old = tmp_path / "data-runner"
    (old / "packages").mkdir(parents=True)
    os.chown(old, free.outer, free.outer)
    (tmp_path / "data").mkdir()
    chosen = f"{free.outer}:{free.count}"
    ids = OwnIds(SandboxSettings(data_dir=tmp_path / "data", sandbox_subuids=chosen))
    try:
        assert ids.home == old / str(free.outer) and (ids.home / "packages").is_dir()
        info = os.lstat(old)
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o711)
    finally:
        ids.close()


def test_where_no_lock_can_be_kept_a_range_is_taken_unheld(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only ``/run`` (a container's) does not stop a root API: its range is taken
    without a lock, said in the log, and still not one a process of it runs in."""
    monkeypatch.setattr(userns, "HELD", Path("/proc/toolkiln-id-ranges"))  # no mkdir there
    taken = userns.embedded_range(None)
    try:
        assert taken.locks == [] and not userns._running(taken.outer, taken.count)
        assert "taken unheld" in caplog.text
    finally:
        taken.close()
