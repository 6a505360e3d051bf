"""A runner's own bookkeeping (runners/host.py): a call's share outlives each of its runs,
idle shares are bounded, and a draining runner takes no new run or analysis."""

from __future__ import annotations

import pytest

from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.runners import host as host_module
from toolkiln.runners.host import RunnerHost
from toolkiln.sandbox.checks import CheckerPool


def test_a_calls_later_runs_get_its_share_and_idle_shares_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_module, "IDLE_SHARES", 3)
    host = RunnerHost({}, CheckerPool())
    first = host.enter("call-1")
    nested = host.enter("call-1")
    assert first is nested and host.in_flight == 2
    host.leave("call-1")
    host.leave("call-1")
    again = host.enter("call-1")  # a later run of the same call (a generation's next example)
    assert again is first
    host.leave("call-1")
    for n in range(2, 6):  # four other calls come and go: the oldest idle share goes
        host.enter(f"call-{n}")
        host.leave(f"call-{n}")
    assert host.enter("call-1") is not first
    assert host.in_flight == 1


def test_a_draining_runner_takes_no_new_run_or_analysis() -> None:
    host = RunnerHost({}, CheckerPool())
    try:
        code = "def main(**p):\n    return {}\n"
        found = host.analyse("python", code, "w")
        assert found is not None and found.entrypoint == "main" and host.analyses == 1
        held = host.enter("call")
        assert held is not None
        assert not host.drain(0.01)  # one run is still in flight
        assert host.enter("another") is None
        assert host.analyse("python", code, "w") is None
        host.leave("call")
        assert host.drain(0.01)
    finally:
        host.close()


def test_a_runner_refuses_checks_past_its_bound_as_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks waiting for a checker hold a server thread each: past MAX_ANALYSING at once the
    runner answers busy (the API's 503) and keeps its threads for runs."""
    host = RunnerHost({}, CheckerPool())
    try:
        code = "def main(**p):\n    return {}\n"
        monkeypatch.setattr(host_module, "MAX_ANALYSING", 1)
        host.analysing = 1  # one under way
        with pytest.raises(ServiceUnavailable):
            host.analyse("python", code, "w")
        host.analysing = 0
        found = host.analyse("python", code, "w")
        assert found is not None and found.entrypoint == "main"
    finally:
        host.close()
