"""api/call_metrics.py: label values stay bounded, whatever the number of workspaces."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from toolkiln.api import call_metrics
from toolkiln.api.call_metrics import CallMetrics


def test_workspaces_past_the_cap_are_counted_as_other() -> None:
    metrics = CallMetrics()
    for i in range(call_metrics.MAX_WORKSPACES + 25):
        metrics.called(f"ws{i}", "custom", "custom", "ok", 0.002)
    metrics.disabled("ws-late")
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    calls = [line for line in text.splitlines() if line.startswith("toolkiln_tool_calls_total{")]
    assert len(calls) == call_metrics.MAX_WORKSPACES + 1
    assert 'toolkiln_tool_calls_total{kind="custom",outcome="ok",workspace="other"} 25.0' in text
    assert 'toolkiln_tool_auto_disables_total{workspace="other"} 1.0' in text
    # The duration histogram has no workspace label at all, and starts at 0.5 ms.
    assert (
        'toolkiln_tool_call_duration_seconds_bucket{kind="custom",le="0.0005",outcome="ok"}' in text
    )
    assert "toolkiln_database_up 1.0" in text
