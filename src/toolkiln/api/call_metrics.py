"""Tool calls on /metrics: counts by workspace, kind and outcome, duration histograms from
0.5 ms, auto-disables, ``http_request`` by outcome, and whether the database answers.

Label values are bounded: ``kind`` and ``outcome`` are fixed sets, and at most
``MAX_WORKSPACES`` workspace ids are labels (later ones are counted as ``other``); no tool id
is ever a label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# The GenAI conventions' default buckets start at 10 ms; a warm call takes 2-5 ms.
BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
MAX_WORKSPACES = 500
OTHER = "other"


class CallMetrics(Collector):
    """The service's ``CallObserver`` (services/ports.py), read by /metrics."""

    def __init__(self, database_ok: Callable[[], bool] = lambda: True) -> None:
        self._database_ok = database_ok
        self._lock = threading.Lock()
        self._workspaces: set[str] = set()
        self.calls = Counter(
            "toolkiln_tool_calls",
            "Tool calls (root and nested, test runs not counted) by workspace, kind, outcome.",
            ["workspace", "kind", "outcome"],
            registry=None,
        )
        self.duration = Histogram(
            "toolkiln_tool_call_duration_seconds",
            "Tool call duration, as the router saw it, by kind and outcome.",
            ["kind", "outcome"],
            buckets=BUCKETS,
            registry=None,
        )
        self.disables = Counter(
            "toolkiln_tool_auto_disables",
            "Tools disabled after consecutive failures, by workspace.",
            ["workspace"],
            registry=None,
        )
        self.http = Counter(
            "toolkiln_http_request_calls",
            "Calls of the http_request built-in by outcome.",
            ["outcome"],
            registry=None,
        )

    def _workspace(self, workspace_id: str) -> str:
        with self._lock:
            if workspace_id in self._workspaces:
                return workspace_id
            if len(self._workspaces) < MAX_WORKSPACES:
                self._workspaces.add(workspace_id)
                return workspace_id
        return OTHER

    def called(self, workspace_id: str, name: str, kind: str, status: str, seconds: float) -> None:
        self.calls.labels(self._workspace(workspace_id), kind, status).inc()
        self.duration.labels(kind, status).observe(seconds)
        if name == "http_request":
            self.http.labels(status).inc()

    def disabled(self, workspace_id: str) -> None:
        self.disables.labels(self._workspace(workspace_id)).inc()

    def collect(self) -> Iterator[Metric]:
        for metric in (self.calls, self.duration, self.disables, self.http):
            yield from metric.collect()
        up = GaugeMetricFamily("toolkiln_database_up", "1 when the database answers.")
        up.add_metric([], 1.0 if self._database_ok() else 0.0)
        yield up
