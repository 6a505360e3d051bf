"""A tool's page as a new user reads it: a refused test run says what is wrong and where, the
Input starts from the schema's examples, empty parts read as empty, the audit is a table, the
form states the service's own limits, and the service's root leads to the view."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.web.conftest import Live, Page, set_code

# The colours of app.css: --bad for errors, --ok for news.
BAD = "rgb(164, 22, 26)"
OK = "rgb(23, 104, 58)"

ECHO = "def main(**params):\n    return {'message': 'got ' + str(sorted(params))}\n"
SILENT = "def main(**params):\n    return {'message': ''}\n"


def colour(locator: Any) -> str:
    return str(locator.evaluate("e => getComputedStyle(e).color"))


def open_tool(tab: Page, name: str) -> Any:
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name=name, exact=True).click()
    expect(page.get_by_role("heading", name=f"Tool: {name}")).to_be_visible()
    return page


def test_a_refused_test_run_lists_each_problem_with_its_field_and_line_as_an_error(
    tab: Page, live: Live
) -> None:
    live.create_tool(name="refused-run", code=ECHO)
    page = open_tool(tab, "refused-run")
    set_code(page, "def main(**params):\n    return {'message': (}\n")
    page.get_by_role("button", name="Test").click()
    run = page.get_by_role("region", name="Test run")
    alert = run.get_by_role("alert")
    expect(alert).to_contain_text("The tool definition has 1 problem")
    problems = alert.get_by_role("list", name="Problems").get_by_role("listitem")
    expect(problems).to_have_count(1)
    expect(problems.first).to_contain_text("code")
    expect(problems.first).to_contain_text("line 2")
    expect(problems.first).to_contain_text("SyntaxError")
    assert colour(alert) == BAD
    expect(run.get_by_test_id("result-status")).to_have_count(0)
    tab.shot("test-run-refused.png", run)
    # The same summary from the checks as you type is an error in the status line, not news.
    status = page.get_by_role("status")
    expect(status).to_have_text("The tool definition has 1 problem.")
    expect(status).to_have_class(re.compile(r"\bis-problem\b"))
    assert colour(status) == BAD

    set_code(page, ECHO)
    expect(status).to_have_text("No problems found.")
    assert colour(status) == OK
    page.get_by_role("button", name="Test").click()
    expect(run.get_by_test_id("result-status")).to_have_text("ok")
    expect(run.get_by_role("alert")).to_have_count(0)


def test_input_starts_from_the_schemas_examples_and_defaults(tab: Page, live: Live) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "examples": ["Oslo", "Lima"]},
            "days": {"type": "integer", "default": 3},
            "units": {"enum": ["metric", "imperial"]},
            "note": {"type": "string"},  # optional, nothing given: left out
            "query": {"type": "string"},  # required, nothing given: empty of its type
            "limit": {"type": "integer", "minimum": 1},
            "where": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "example": 59.9},
                    "alt": {"type": "number"},
                },
                "required": ["lat"],
            },
        },
        "required": ["city", "query", "limit", "where"],
    }
    live.create_tool(name="weather-input", code=ECHO, input_schema=schema)
    whole = {"type": "object", "properties": {"q": {"type": "string"}}, "examples": [{"q": "tea"}]}
    live.create_tool(name="whole-example", code=ECHO, input_schema=whole)
    page = open_tool(tab, "weather-input")
    assert json.loads(page.get_by_label("Input").input_value()) == {
        "city": "Oslo",
        "days": 3,
        "units": "metric",
        "query": "",
        "limit": 1,
        "where": {"lat": 59.9},
    }
    page.get_by_role("link", name="All tools").click()
    page.get_by_role("link", name="whole-example", exact=True).click()
    expect(page.get_by_label("Input")).to_have_value(json.dumps({"q": "tea"}, indent=2))

    # A new tool's Input follows its Parameters until it is edited by hand.
    page.get_by_role("link", name="All tools").click()
    page.get_by_role("button", name="New tool").click()
    expect(page.get_by_label("Input")).to_have_value(json.dumps({"name": "Ada"}, indent=2))
    page.get_by_label("Parameters").fill(json.dumps({"properties": {"n": {"default": 7}}}))
    expect(page.get_by_label("Input")).to_have_value(json.dumps({"n": 7}, indent=2))
    page.get_by_label("Input").fill('{"n": 8}')
    page.get_by_label("Parameters").fill(json.dumps({"properties": {"m": {"default": 1}}}))
    expect(page.get_by_label("Input")).to_have_value('{"n": 8}')


def test_an_empty_message_and_llm_read_as_none(tab: Page, live: Live) -> None:
    live.create_tool(name="says-nothing", code=SILENT)
    page = open_tool(tab, "says-nothing")
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-status")).to_have_text("ok")
    for part in ("result-message", "result-llm", "result-raw"):
        expect(page.get_by_test_id(part)).to_have_text("(none)")
        expect(page.get_by_test_id(part)).to_have_class("none")
    # Text a tool did write is in a box of its own, whatever it says.
    set_code(
        page, "def main(**params):\n    return {'message': '(none)', '_llm': 'for the model'}\n"
    )
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-llm")).to_have_text("for the model")
    expect(page.get_by_test_id("result-message")).to_have_text("(none)")
    assert page.get_by_test_id("result-message").evaluate("e => e.tagName") == "PRE"


def test_the_services_root_leads_to_the_view_and_v1_is_unchanged(tab: Page, live: Live) -> None:
    page = tab.page
    page.goto(live.url)
    expect(page.get_by_label("Token")).to_be_visible()
    assert page.url == f"{live.url}/ui"
    root = live.http.get("/", follow_redirects=False)
    assert (root.status_code, root.headers["location"]) == (307, "/ui")
    for path in ("/v1", "/v1/", "/v1/no-such-thing", "/nothing-here"):
        res = live.http.get(path, follow_redirects=False)
        assert res.status_code == 404, path
        assert res.json()["error"]["code"] == "not_found", path
    assert "/" not in live.http.get("/openapi.json").json()["paths"]


@pytest.fixture(scope="module")
def audited(live: Live) -> dict[str, Any]:
    code = (
        "def main(*, ctx, **params):\n"
        "    ctx.audit('looked', {'rows': list(range(40)), 'why': 'a long list of rows'})\n"
        "    return {'message': 'done'}\n"
    )
    tool = live.create_tool(name="audited-tool", code=code)
    res = live.http.post(
        f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}, "tool_call_id": "call_au_1"}
    )
    assert res.status_code == 200 and res.json()["data"]["status"] == "ok", res.text
    patched = live.http.patch(f"/v1/custom-tools/{tool['id']}", json={"description": "v2"})
    assert patched.status_code == 200, patched.text
    return tool


def audit_rows(tab: Page) -> Any:
    """The audit table's rows (not its header) on the page of the tool `audited` made."""
    page = open_tool(tab, "audited-tool")
    table = page.get_by_role("table", name="Audit rows of this tool, newest first")
    rows = table.get_by_role("row").filter(has=page.get_by_role("cell"))
    expect(rows).to_have_count(4)
    return rows


def test_the_audit_is_a_table_with_each_rows_data_folded(
    tab: Page, live: Live, audited: dict[str, Any]
) -> None:
    rows = audit_rows(tab)
    events = [rows.nth(i).get_by_role("cell").nth(1).inner_text() for i in range(4)]
    assert events == ["tool.updated", "tool.invoked", "custom.looked", "tool.created"]
    updated, invoked, custom, created = (rows.nth(i).get_by_role("cell") for i in range(4))
    expect(updated.nth(4)).to_have_text("version 2 · changed description, version")
    expect(invoked.nth(2)).to_have_text("api")
    expect(invoked.nth(3)).to_have_text("call_au_1")
    expect(invoked.nth(4)).to_have_text(
        re.compile(r"^ok · [\d.]+ ms( · \d+ ctx calls?)? · version 1$")
    )
    expect(custom.nth(2)).to_have_text("code")
    expect(custom.nth(4)).to_contain_text('{"rows":[0,1,2')
    expect(created.nth(3)).to_have_text("(none)")
    # The data is folded: one click shows it, as JSON text.
    data = custom.nth(5).locator("pre")
    expect(data).to_be_hidden()
    custom.nth(5).get_by_text("Data", exact=True).click()
    expect(data).to_be_visible()
    assert json.loads(data.inner_text())["why"] == "a long list of rows"


def test_the_audit_and_calls_read_on_a_narrow_screen(
    narrow: Page, live: Live, audited: dict[str, Any]
) -> None:
    rows = audit_rows(narrow)
    page = narrow.page
    for i in range(4):
        rows.nth(i).get_by_text("Data", exact=True).click()
    expect(rows.nth(2).locator("pre")).to_be_visible()
    # Each row is a card whose cells say what they are; nothing scrolls sideways.
    assert rows.nth(1).evaluate("e => getComputedStyle(e).display") == "block"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # No cell runs past its card (a long line of data wraps instead of being cut off).
    wide = "[...document.querySelectorAll('table.cards td')].filter(td => td.scrollWidth > td.clientWidth + 1).length"
    assert page.evaluate(wide) == 0
    box = page.get_by_role("region", name="Audit").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    expect(page.get_by_role("button", name="Show result of call call_au_1")).to_be_visible()
    narrow.shot("audit-narrow.png", page.get_by_role("region", name="Audit"))


def test_the_form_states_the_services_limits(tab: Page, live: Live) -> None:
    """The bounds come from the service: the workspace's policy lowers the timeout ceiling,
    the API document gives the name's length and the number of test cases."""
    doc = live.http.get("/openapi.json").json()["components"]["schemas"]["ToolCreate"]
    fields = doc["properties"]
    policy = f"/v1/workspaces/{live.workspace_id}/policy"
    before = live.http.get(policy).json()["data"]["max_timeout_ms"]
    assert live.http.patch(policy, json={"max_timeout_ms": 2000}).status_code == 200
    try:
        page = tab.page
        tab.sign_in()
        page.get_by_role("button", name="New tool").click()
        timeout = page.get_by_label("Timeout (ms)")
        expect(timeout).to_have_value("2000")  # the language's default, held to the ceiling
        expect(timeout).to_have_attribute("max", "2000")
        expect(timeout).to_have_attribute("min", str(int(fields["timeout_ms"]["minimum"])))
        hints = page.locator(".hint")
        expect(hints.filter(has_text="milliseconds")).to_have_text(
            f"milliseconds: {int(fields['timeout_ms']['minimum'])} to 2000, default 2000"
        )
        expect(hints.filter(has_text="kebab")).to_contain_text(
            f"at most {fields['name']['maxLength']} characters"
        )
        expect(hints.filter(has_text="JSON list")).to_contain_text(
            f"at most {fields['test_cases']['maxItems']};"
        )
        # Saved with the ceiling the form stated, the tool keeps it.
        page.get_by_label("Name").fill("bounded-tool")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("heading", name="Tool: bounded-tool")).to_be_visible()
        tool_id = page.url.rsplit("/", 1)[1]
        assert live.tool(tool_id).json()["data"]["timeout_ms"] == 2000
    finally:
        assert live.http.patch(policy, json={"max_timeout_ms": before}).status_code == 200


def test_lists_are_read_at_the_page_size_the_api_states(tab: Page, live: Live) -> None:
    params = live.http.get("/openapi.json").json()["paths"]["/v1/custom-tools"]["get"]
    limit = next(p for p in params["parameters"] if p["name"] == "limit")["schema"]["anyOf"]
    largest = next(branch["maximum"] for branch in limit if "maximum" in branch)
    page = tab.page
    with page.expect_request(re.compile(r".*/v1/custom-tools\?.*")) as listing:
        tab.sign_in()
    assert f"limit={largest}" in listing.value.url
