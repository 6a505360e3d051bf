"""A run bounded by a deadline (a nested run, or a root run sent again after a one-way try)
whose time runs out while it waits for a process is a ``timeout``, not counted, never an
``infra_error``; a sandbox that cannot give a process to a run with time left stays
``infra``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.sandbox.links import NoCtx
from toolkiln.domain.execution import RunRequest
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable
from toolkiln.sandbox.runner import Limits, Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox

CODE = "def handle(i, c):\n    return 1\n"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(
        PackageStore(tmp_path_factory.mktemp("pkgs")),
        warm=1,
        limits=Limits(concurrent_calls=2),
        name="waitdl",
    )
    yield sb
    sb.close()


def no_process(req: RunRequest, timeout: float) -> None:
    raise SandboxUnavailable("no process became ready")


def test_time_that_ran_out_waiting_for_a_process_is_a_timeout(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox.runtime, "take", no_process)
    req = RunRequest("python", CODE, "handle", {}, 1000, workspace_id="w",
                     not_after=time.monotonic() - 0.01)  # fmt: skip
    got = sandbox.run(req, NoCtx())
    assert got.kind == "timeout", (got.kind, got.message)
    assert got.details.get("counted") is False


def test_a_sandbox_without_a_process_for_a_run_with_time_left_is_infra(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox.runtime, "take", no_process)
    got = sandbox.run(RunRequest("python", CODE, "handle", {}, 1000, workspace_id="w"), NoCtx())
    assert got.kind == "infra", (got.kind, got.message)
