"""A one-way run given up at its ctx call goes again with its whole time (docs/decisions/151)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.test_invoke import REACHES_CTX, get_tool, invoke, make
from tests.conftest import Space

# Given no ctx and naming nothing the analysis reads as a way to it, so it is sent one way;
# it works for a while, then reaches the jail's ctx through its frames.
SLOW_THEN_CTX = "import time\n" + REACHES_CTX.replace(
    "def main(**p):\n", "def main(**p):\n    time.sleep(1.0)\n", 1
)


def test_a_one_way_run_given_up_at_its_ctx_call_keeps_the_tools_whole_time(
    client: TestClient, space: Space, rw
) -> None:
    """Sent one way, given up at its ctx call after 1 s, and sent again on the stream: with
    only what was left of its 1.5 s it timed out and was counted (three disable the tool);
    the rerun has its whole time, runner and API deadlines alike, and answers as the same
    code given ctx does (the control below)."""
    tool = make(client, space, rw, SLOW_THEN_CTX, timeout_ms=1500)
    for n in (1, 2, 3):
        res = invoke(client, tool, rw)
        assert res["status"] == "ok" and "42" in res["message"], (
            n,
            {k: res.get(k) for k in ("status", "error", "message", "duration_ms")},
            get_tool(client, tool, rw)["failure_count"],
        )
    assert get_tool(client, tool, rw)["failure_count"] == 0


def test_control_the_same_code_given_ctx_answers_within_its_time(
    client: TestClient, space: Space, rw
) -> None:
    code = SLOW_THEN_CTX.replace("def main(**p):", "def main(*, ctx, **p):")
    tool = make(client, space, rw, code, timeout_ms=1500)
    for n in (1, 2, 3):
        res = invoke(client, tool, rw)
        assert res["status"] == "ok" and "42" in res["message"], (n, res)
    assert get_tool(client, tool, rw)["failure_count"] == 0
