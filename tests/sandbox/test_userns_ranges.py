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

import pytest

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
