"""The API's view of its runners (runners/fleet.py) when none answers."""

from __future__ import annotations

from toolkiln.domain.execution import RunRequest
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
