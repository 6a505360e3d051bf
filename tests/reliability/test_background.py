"""The supervisor keeps background loops alive through their own errors, with backoff, and
the LISTEN trigger fires for exactly the events that change tool lists."""

from __future__ import annotations

import importlib

import anyio
import pytest

from toolkiln.domain.records import LIST_CHANGING_EVENTS
from toolkiln.services.background import Supervisor


def test_a_failing_loop_is_restarted_and_reports_its_state() -> None:
    supervisor = Supervisor(first_delay_s=0.001, max_delay_s=0.004)
    runs: list[int] = []
    seen: list[dict] = []

    async def flaky(healthy) -> None:  # type: ignore[no-untyped-def]
        runs.append(1)
        if len(runs) <= 3:
            raise OSError(f"database blip {len(runs)}")
        seen.append(supervisor.health()["flaky"])
        healthy()
        seen.append(supervisor.health()["flaky"])

    anyio.run(supervisor.run, "flaky", flaky)
    assert len(runs) == 4
    assert seen[0] == {
        "status": "degraded",
        "restarts": 3,
        "last_error": "OSError: database blip 3",
    }
    assert seen[1] == {"status": "ok", "restarts": 3, "last_error": None}
    assert supervisor.health() == {}  # a loop that ended is not reported


def test_cancellation_passes_through_the_supervisor() -> None:
    supervisor = Supervisor()

    async def main() -> None:
        started = anyio.Event()

        async def forever(healthy) -> None:  # type: ignore[no-untyped-def]
            healthy()
            started.set()
            await anyio.sleep_forever()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(supervisor.run, "forever", forever)
                await started.wait()
                assert supervisor.health()["forever"]["status"] == "ok"
                tasks.cancel_scope.cancel()

    anyio.run(main)
    assert supervisor.health() == {}


@pytest.mark.parametrize("module", ["0008_files_in_database_and_list_notify"])
def test_notify_trigger_covers_every_list_changing_event(module: str) -> None:
    migration = importlib.import_module(f"toolkiln.storage.migrations.versions.{module}")
    assert sorted(migration.EVENTS) == sorted(LIST_CHANGING_EVENTS)


def test_healthz_names_each_degraded_part_and_why() -> None:
    from toolkiln.services.system import SystemService

    pools = {
        "python": {
            "available": True,
            "ready": True,
            "pool": {"degraded": True, "reason": "the sandbox template died; restarting it"},
        },
        "javascript": {"available": True, "ready": True, "pool": {"degraded": False}},
    }
    ready, body = SystemService(
        lambda: "OperationalError: connection refused", lambda: pools
    ).health()
    assert not ready and body["status"] == "unavailable"
    assert body["degraded"] == [
        {"part": "database", "reason": "OperationalError: connection refused"},
        {"part": "runtime.python", "reason": "the sandbox template died; restarting it"},
    ]
    pools["python"]["pool"] = {"degraded": False}
    ready, body = SystemService(lambda: None, lambda: pools).health()
    assert ready and body["degraded"] == [] and body["database"] == "ok"
