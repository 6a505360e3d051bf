"""The runners' figures on /metrics: places, calls in flight and waiting, state, the code
checks each made, and the time this API process's runs waited between being sent and
starting (the hop and the queue)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from toolkiln.runners.client import WAIT_BUCKETS

STATES = ("serving", "degraded", "draining", "unreachable", "refused", "unknown")
TAKING = ("serving", "degraded")


class RunnerMetrics(Collector):
    def __init__(self, runners: Callable[[], list[dict[str, Any]]]) -> None:
        self._runners = runners

    def collect(self) -> Iterator[Metric]:
        found = self._runners()
        gauges = {
            name: GaugeMetricFamily(f"toolkiln_runner_{name}", text, labels=["runner"])
            for name, text in (
                ("places", "Calls a runner can run at once."),
                ("in_flight", "Calls running on a runner, as it last said."),
                ("waiting", "Calls waiting for a place on a runner, as it last said."),
            )
        }
        state = GaugeMetricFamily(
            "toolkiln_runner_state", "1 for a runner's current state.", labels=["runner", "state"]
        )
        runs = CounterMetricFamily(
            "toolkiln_runner_runs", "Runs this process started on a runner.", labels=["runner"]
        )
        analyses = CounterMetricFamily(
            "toolkiln_runner_analyses",
            "Code checks a runner made, as it last said.",
            labels=["runner"],
        )
        waited = CounterMetricFamily(
            "toolkiln_runner_queue_wait_seconds",
            "Time this process's runs took from being sent to a runner to starting there.",
            labels=["runner"],
        )
        histogram = HistogramMetricFamily(
            "toolkiln_runner_wait_seconds",
            "This process's runs' time from being sent to a runner to starting there.",
            labels=["runner"],
        )
        paths = CounterMetricFamily(
            "toolkiln_runner_run_paths",
            "How this process's runs went to a runner: one_way, stream, or a one-way try"
            " declined (busy, wait, ctx: one more round trip each).",
            labels=["runner", "path"],
        )
        available = GaugeMetricFamily(
            "toolkiln_runners_available", "Runners that take calls (serving or degraded)."
        )
        available.add_metric([], float(sum(r["state"] in TAKING for r in found)))
        for runner in found:
            address = str(runner["address"])
            counts = list(runner.get("waits", []))
            if len(counts) == len(WAIT_BUCKETS) + 1:
                total, buckets = 0, []
                for bound, count in zip([*map(str, WAIT_BUCKETS), "+Inf"], counts, strict=True):
                    total += count
                    buckets.append((bound, float(total)))
                histogram.add_metric([address], buckets, float(runner.get("queue_wait_s", 0.0)))
            for name, gauge in gauges.items():
                gauge.add_metric([address], float(runner[name]))
            for name in STATES:
                state.add_metric([address, name], 1.0 if runner["state"] == name else 0.0)
            runs.add_metric([address], float(runner.get("runs", 0)))
            analyses.add_metric([address], float(runner.get("analyses", 0)))
            waited.add_metric([address], float(runner.get("queue_wait_s", 0.0)))
            for path, count in dict(runner.get("paths", {})).items():
                paths.add_metric([address, str(path)], float(count))
        yield from gauges.values()
        yield from (state, runs, analyses, waited, histogram, paths, available)
