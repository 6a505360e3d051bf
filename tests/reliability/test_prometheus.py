"""Debian's real Prometheus scrapes a service's /metrics and answers PromQL about its calls:
the call-duration histogram's quantile, calls by workspace and outcome, auto-disables,
``http_request`` by outcome, database and runner availability."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port, own_service, serving
from tests.reliability.harness import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
TOKEN = "tk_prometheus-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OK = "def main(**p):\n    return {'message': 'ok'}\n"
BAD = "def main(**p):\n    raise ValueError('no')\n    return {}\n"
CALLS = 12
DASHBOARD = ROOT / "docs" / "grafana" / "toolkiln-dashboard.json"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A service on loopback, and a Prometheus scraping its /metrics every second."""
    with own_service(tmp_path / "data", TOKEN) as (rt, _, _), serving(rt) as base:
        target = base.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: toolkiln\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for("prometheus", lambda: _ready(url, proc), 60)
            yield url, base
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()


def _ready(url: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, "prometheus exited"
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _value(url: str, promql: str) -> float | None:
    found = _query(url, promql)
    return float(found[0]["value"][1]) if found else None


def test_prometheus_answers_promql_about_the_calls(prometheus: tuple[str, Any]) -> None:
    url, base = prometheus
    http = httpx.Client(base_url=base, headers=AUTH, timeout=60)
    ws = http.get("/v1/workspaces").json()["data"][0]["id"]
    tools = {}
    for name, code in (("fine", OK), ("broken", BAD)):
        body = {"workspace_id": ws, "name": name, "language": "python", "code": code}
        tools[name] = http.post("/v1/custom-tools", json=body).json()["data"]["id"]
    for _ in range(CALLS):
        assert http.post(f"/v1/custom-tools/{tools['fine']}/invoke", json={}).status_code == 200
    for _ in range(4):  # three failures disable it; the fourth is refused
        http.post(f"/v1/custom-tools/{tools['broken']}/invoke", json={})
    refused = {"method": "GET", "url": "http://not-listed.invalid/"}
    r = http.post("/v1/builtin-tools/http_request/call", json={"input": refused})
    assert r.status_code == 200 and r.json()["data"]["error"], r.text

    def scraped() -> bool:
        return _value(url, f'sum(toolkiln_tool_calls_total{{workspace="{ws}"}})') == CALLS + 5

    wait_for("a scrape with every call", scraped, 60)
    assert (
        _value(url, f'toolkiln_tool_calls_total{{workspace="{ws}",kind="custom",outcome="ok"}}')
        == CALLS
    )
    assert _value(url, f'sum(toolkiln_tool_calls_total{{workspace="{ws}",outcome="error"}})') == 5
    assert _value(url, f'toolkiln_tool_auto_disables_total{{workspace="{ws}"}}') == 1
    assert _value(url, 'toolkiln_http_request_calls_total{outcome="error"}') == 1
    assert _value(url, "toolkiln_database_up") == 1
    assert _value(url, "toolkiln_runners_available") == 1
    # The histogram's buckets start at 0.5 ms and Prometheus reads them as one histogram.
    le = {s["metric"]["le"] for s in _query(url, "toolkiln_tool_call_duration_seconds_bucket")}
    assert "0.0005" in le and "+Inf" in le
    p50 = _value(
        url,
        'histogram_quantile(0.5, sum by (le) (toolkiln_tool_call_duration_seconds_bucket{kind="custom"}))',
    )
    assert p50 is not None and not math.isnan(p50) and 0 < p50 < 30
    wait = _value(
        url, "histogram_quantile(0.99, sum by (le) (toolkiln_runner_wait_seconds_bucket))"
    )
    assert wait is not None and 0 < wait <= 5
    # No tool id is a label value anywhere.
    for name in ("toolkiln_tool_calls_total", "toolkiln_tool_call_duration_seconds_bucket"):
        for sample in _query(url, name):
            assert not set(sample["metric"].values()) & set(tools.values())

    # Every query of the documented Grafana dashboard is one Prometheus answers with data.
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$workspace", ".*")
            # (a rate needs two scrapes after the first call: waited for)
            wait_for(panel["title"], lambda e=expr: bool(_query(url, e)), 30)
