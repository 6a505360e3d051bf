"""The stats as charts, in Chromium: on a tool's page calls, failures and p50/p99 over the
chosen window (drawn, named in words, and as a table); on the list each tool's last 24
hours, the failing tools first; readable on a 390 px screen."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import expect

from tests.web.conftest import Live, Page

CODE = (
    "def main(**p):\n"
    "    if p.get('fail'):\n"
    "        raise ValueError('asked to')\n"
    "    return {'message': 'ok'}\n"
)
PARAMS = {"fail": {"type": "boolean"}}
# Pixels of a canvas that are not blank: a chart was drawn on it.
DRAWN = """c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
  return n;
}"""


def _tool_with_calls(live: Live, name: str, ok: int, failed: int) -> dict[str, Any]:
    tool = live.create_tool(name=name, code=CODE, parameters=PARAMS)
    for _ in range(ok):
        assert live.invoke(tool["id"], {})["status"] == "ok"
    for _ in range(failed):
        assert live.invoke(tool["id"], {"fail": True})["error"]["code"] == "runtime_error"
    return tool


def _open(tab: Page, name: str) -> Any:
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name=name, exact=True).click()
    expect(page.get_by_role("heading", name=f"Tool: {name}")).to_be_visible()
    return page


def test_a_tools_page_charts_its_calls_failures_and_percentiles(tab: Page, live: Live) -> None:
    _tool_with_calls(live, "charted", ok=5, failed=2)
    page = _open(tab, "charted")
    stats = page.get_by_role("region", name="Calls over time")
    summary = stats.locator(".stats-summary")
    expect(summary).to_contain_text("7 calls in the last 24h, 2 failed (2 runtime_error)")
    expect(summary).to_contain_text("p50")
    calls = stats.get_by_role("img", name="Calls and failures per bucket: 7 calls", exact=False)
    durations = stats.get_by_role("img", name="p50 and p99 duration per bucket", exact=False)
    for chart in (calls, durations):
        canvas = chart.locator("canvas")
        expect(canvas).to_have_count(1)
        assert canvas.evaluate(DRAWN) > 100
    expect(calls).to_contain_text("failed")  # the legend names the series
    stats.get_by_text("The same as a table").click()
    rows = stats.get_by_role("table", name=re.compile("Buckets with calls")).get_by_role("row")
    expect(rows.nth(1)).to_contain_text("2 runtime_error")
    stats.get_by_role("button", name="1h").click()
    expect(stats.get_by_role("button", name="1h")).to_have_attribute("aria-pressed", "true")
    expect(summary).to_contain_text("in the last 1h")
    tab.shot("tool-charts.png", stats)


def test_the_list_shows_each_tools_day_and_the_failing_tools_first(tab: Page, live: Live) -> None:
    _tool_with_calls(live, "aaa-quiet", ok=3, failed=0)
    _tool_with_calls(live, "zzz-failing", ok=1, failed=2)
    page = tab.page
    tab.sign_in()
    table = page.get_by_role("table", name="Custom tools of this workspace")
    failing = table.get_by_role("row").filter(has_text="zzz-failing")
    expect(failing.locator("td.activity")).to_contain_text("3 calls, 2 failed")
    quiet = table.get_by_role("row").filter(has_text="aaa-quiet")
    expect(quiet.locator("td.activity")).to_contain_text("3 calls")
    names = table.get_by_role("row").locator("td.name").all_inner_texts()
    assert names.index("zzz-failing") < names.index("aaa-quiet"), names
    spark = failing.get_by_role("img")
    label = re.compile(r"^3 calls in the last 24h, 2 failed \(2 runtime_error\); p50 ")
    expect(spark).to_have_attribute("aria-label", label)
    assert spark.locator("canvas").evaluate(DRAWN) > 0
    expect(page.get_by_text("with failures in the last 24 hours")).to_be_visible()


def test_the_charts_fit_a_390_px_screen(narrow: Page, live: Live) -> None:
    _tool_with_calls(live, "narrow-charted", ok=2, failed=1)
    page = _open(narrow, "narrow-charted")
    stats = page.get_by_role("region", name="Calls over time")
    expect(stats.locator(".stats-summary")).to_contain_text("3 calls")
    for canvas in stats.locator("canvas").all():
        box = canvas.bounding_box()
        assert box is not None and 200 <= box["width"] and box["x"] + box["width"] <= 390, box
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    narrow.shot("tool-charts-narrow.png", stats)
