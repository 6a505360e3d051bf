"""A run nested under a call never outlives that call's deadline, whatever it waits for
before it starts: here, the install of a listed package its code imports. A root call that
waited for an install gets its whole time limit afterwards (docs/security.md, "Packages");
a nested run has only what its caller has left."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

SPEC = "pytz==2025.2"
# Imports a listed package (so the host waits for its install), then runs past any deadline.
SLOW = "import time\ndef handle(input, ctx):\n    time.sleep(10)\n    import pytz\n    return 1\n"
CALLER = "def handle(input, ctx):\n    return ctx.tools.slow({})\n"


@pytest.fixture(scope="module")
def t(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "nested-deadlines")


def test_a_nested_run_that_waited_for_an_install_ends_at_its_callers_deadline(
    target: Target, t: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = target.runtime.sandboxes["python"].packages
    installed, fetch, done = store.installed, store.fetch, threading.Event()

    def slow_install(spec: str, staging: Path) -> str | None:
        if spec != SPEC:
            return fetch(spec, staging)
        done.wait(10)  # it ends 1.5 s into the call, having installed nothing
        return None

    monkeypatch.setattr(store, "installed", lambda spec: spec != SPEC and installed(spec))
    monkeypatch.setattr(store, "fetch", slow_install)
    t.tool("slow", SLOW, language="python", timeout_ms=2000)
    caller = t.tool("caller", CALLER, language="python", timeout_ms=2000)
    timer = threading.Timer(1.5, done.set)
    try:
        timer.start()
        started = time.monotonic()
        result = t.invoke(caller)
        took = time.monotonic() - started
    finally:
        done.set()
        timer.cancel()
    assert result["status"] == "error" and result["error"]["code"] == "timeout", result["error"]
    assert took < 2.8, f"a 2 s call took {took:.1f} s: its nested run had its own 2 s after"
    target.assert_contained()
