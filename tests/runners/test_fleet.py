"""The API's view of its runners (runners/fleet.py) when none answers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from toolkiln.domain.execution import RunRequest
from toolkiln.runners import fleet as fleet_module
from toolkiln.runners.client import RunnerClient
from toolkiln.runners.fleet import Fleet


class Link:
    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {}

    def audit(self, event: str, data: object) -> str | None:
        return None


def test_with_no_runner_a_runtime_is_described_as_unavailable_and_a_run_is_infra() -> None:
    fleet = Fleet(["unix:/nonexistent/toolkiln-runner.sock"], "token", watch=False)
    try:
        described = fleet.describe("python")
        # The whole shape: what reads it (a generation's prompt) needs every key.
        assert described["available"] is False and described["entrypoints"] == []
        assert described["pool"]["degraded"] is True
        assert fleet.status()[0]["state"] == "unreachable" and not fleet.ready()
        req = RunRequest("python", "def main(): pass", "main", {}, 300, workspace_id="w")
        assert fleet.run(req, Link()).kind == "infra"
    finally:
        fleet.close()


def test_a_stale_description_is_given_at_once_while_one_thread_asks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    release = threading.Event()

    def describe(_runner: RunnerClient) -> dict[str, Any]:
        asked.append(1)
        if len(asked) > 1:
            release.wait(30)
        return {"python": {"available": True, "answer": len(asked)}}

    monkeypatch.setattr(RunnerClient, "describe", describe)
    monkeypatch.setattr(RunnerClient, "usable", property(lambda _runner: True))
    monkeypatch.setattr(fleet_module, "DESCRIBE_S", 0.0)
    fleet = Fleet(["unix:/nonexistent/toolkiln-runner.sock"], "token", watch=False)
    try:
        assert fleet.describe("python")["answer"] == 1  # the first answer is waited for
        # Stale from now on: every caller gets the kept answer while one thread asks again.
        assert all(fleet.describe("python")["answer"] == 1 for _ in range(20))
        assert len(asked) == 2
        release.set()
        ready, pause = threading.Event(), threading.Event()
        for _ in range(600):
            if fleet.describe("python")["answer"] > 1:
                ready.set()
                break
            pause.wait(0.05)
        assert ready.is_set()
    finally:
        release.set()
        fleet.close()
