"""The view's journeys in Chromium, through the accessible names of CONTRACT section 10."""

from __future__ import annotations

import json
import re
from typing import Any

from playwright.sync_api import expect

from tests.web.conftest import TOKEN, Live, Page, set_code

FLAKY = "def main(**params):\n    raise ValueError('kaboom')\n    return {'message': 'never'}\n"
ORDER = (
    "def main(**params):\n"
    "    order_id = params['order_id']\n"
    "    return {'message': f'Order {order_id} is shipped', 'rawData': {'id': order_id}}\n"
)
ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}


def row_of(page: Any, name: str) -> Any:
    return page.get_by_role("row").filter(has=page.get_by_role("link", name=name, exact=True))


def test_sign_in_keeps_the_token_for_the_tab_only(tab: Page, live: Live) -> None:
    page = tab.page
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(f"{live.url}/ui")
    token_field = page.get_by_role("textbox", name="Token")
    expect(token_field).to_be_visible()
    assert token_field.evaluate("e => getComputedStyle(e).webkitTextSecurity") == "disc"
    tab.sign_in("not-a-token")
    expect(page.get_by_role("alert")).not_to_be_empty()
    expect(page.get_by_role("table")).to_have_count(0)
    with page.expect_request(re.compile(r".*/v1/custom-tools\?.*")) as listing:
        tab.sign_in()
    assert listing.value.headers["authorization"] == f"Bearer {TOKEN}"
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    expect(page.get_by_role("table")).to_be_visible()
    assert TOKEN not in page.url
    assert urls and not [u for u in urls if TOKEN in u]
    assert page.context.cookies() == []
    assert page.evaluate("sessionStorage.getItem('toolkiln.token')") == TOKEN
    # A reload keeps the tab signed in; signing out forgets the token.
    page.reload()
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("Token")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('toolkiln.token')") is None


def test_counts_move_after_invocations_and_an_auto_disabled_tool_is_re_enabled(
    tab: Page, live: Live
) -> None:
    tool = live.create_tool(name="flaky-tool", code=FLAKY)
    page = tab.page
    tab.sign_in()
    row = row_of(page, "flaky-tool")
    cells = row.get_by_role("cell")
    expect(cells.nth(0)).to_have_text("flaky-tool")
    expect(cells.nth(2)).to_have_text("0")
    for _ in range(3):
        assert live.invoke(tool["id"], {})["status"] == "error"
    # No reload: the list polls and the row catches up by itself.
    expect(cells.nth(2)).to_have_text("3")
    expect(cells.nth(3)).to_have_text("3")
    expect(cells.nth(1)).to_contain_text("disabled")
    expect(cells.nth(1)).to_contain_text("3 consecutive failures")
    expect(cells.nth(4)).to_contain_text("kaboom")
    page.get_by_label("Status").select_option("disabled")
    expect(row).to_be_visible()
    page.get_by_label("Status").select_option("active")
    expect(row).to_have_count(0)
    page.get_by_label("Status").select_option("")

    page.get_by_role("link", name="flaky-tool", exact=True).click()
    expect(page.get_by_test_id("tool-status")).to_have_text("disabled")
    page.get_by_role("button", name="Enable").click()
    expect(page.get_by_test_id("tool-status")).to_have_text("active")
    expect(page.get_by_role("button", name="Disable")).to_be_focused()
    expect(page.get_by_role("button", name="Enable")).to_have_count(0)
    assert live.tool(tool["id"]).json()["data"]["failure_count"] == 0
    page.get_by_role("link", name="All tools").click()
    expect(row_of(page, "flaky-tool").get_by_role("cell").nth(3)).to_have_text("0")
    expect(row_of(page, "flaky-tool").get_by_role("cell").nth(1)).to_have_text("active")


def test_create_refuses_a_syntax_error_at_its_line_then_edits_versions_and_deletes(
    tab: Page, live: Live
) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="New tool").click()
    page.get_by_label("Name").fill("greet-someone")
    page.get_by_label("Description").fill("Greets someone by name.")
    set_code(page, "def main(**params):\n    return {'message': (}\n")
    page.get_by_role("button", name="Save").click()
    code_error = page.locator("[data-field=code] .field-error")
    expect(code_error).to_contain_text("line 2")
    expect(page.locator(".cm-line").nth(1).locator(".cm-lintRange-error")).to_have_count(1)
    expect(page.locator(".form-alert").first).to_contain_text("problem")
    names = [t["name"] for t in live.http.get("/v1/custom-tools").json()["data"]]
    assert "greet-someone" not in names
    tab.shot("editor.png", page.get_by_role("form", name="Tool"))

    set_code(page, "def main(**params):\n    return {'message': 'Hello ' + params['name']}\n")
    page.get_by_label("Parameters").fill(
        json.dumps({"type": "object", "properties": {"name": {"type": "string"}}})
    )
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Tool: greet-someone")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("version 1")
    tool_id = page.url.rsplit("/", 1)[1]
    assert live.tool(tool_id).json()["data"]["description"] == "Greets someone by name."

    set_code(page, "def main(**params):\n    return {'message': 'Hi ' + params['name']}\n")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved: version 2")
    versions = page.get_by_role("list", name="Versions").get_by_role("listitem")
    expect(versions).to_have_count(2)
    page.get_by_label("From version").select_option("1")
    page.get_by_label("To version").select_option("2")
    page.get_by_role("button", name="Show diff").click()
    diff = page.get_by_label("Changes from version 1 to 2")
    expect(diff.locator(".diff-del")).to_contain_text("'Hello '")
    expect(diff.locator(".diff-add")).to_contain_text("'Hi '")

    page.once("dialog", lambda d: d.dismiss())
    page.get_by_role("button", name="Delete").click()
    expect(page.get_by_role("heading", name="Tool: greet-someone")).to_be_visible()
    assert live.tool(tool_id).status_code == 200
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete").click()
    expect(page.get_by_role("heading", name="Custom tools")).to_be_visible()
    expect(page.get_by_role("status")).to_have_text("Deleted greet-someone.")
    expect(row_of(page, "greet-someone")).to_have_count(0)
    assert live.tool(tool_id).status_code == 404


def test_test_run_shows_the_result_and_an_input_problem_next_to_input(
    tab: Page, live: Live
) -> None:
    tool = live.create_tool(name="order-status", code=ORDER, input_schema=ORDER_SCHEMA)
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="order-status", exact=True).click()
    page.get_by_label("Input").fill("{not json")
    page.get_by_role("button", name="Test").click()
    expect(page.locator("[data-field=input] .field-error")).to_contain_text("not valid JSON")

    page.get_by_label("Input").fill('{"order_id": "A-17"}')
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-status")).to_have_text("ok")
    expect(page.get_by_test_id("result-message")).to_have_text("Order A-17 is shipped")
    result = page.locator("dl.result")
    expect(result).to_contain_text("Duration")
    expect(result).to_contain_text("ctx calls")
    expect(result).to_contain_text('"id": "A-17"')
    tab.shot("test-run.png", page.get_by_role("region", name="Test run"))
    # A test run counts nothing.
    assert live.tool(tool["id"]).json()["data"]["usage_count"] == 0

    page.get_by_label("Input").fill("{}")
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-status")).to_have_text("error")
    expect(result).to_contain_text("invalid_input")

    # The form from the schema writes into Input.
    page.get_by_role("button", name="Form from schema").click()
    page.get_by_label("order_id (string, required)").fill("C-3")
    expect(page.get_by_label("Input")).to_have_value('{\n  "order_id": "C-3"\n}')
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-message")).to_have_text("Order C-3 is shipped")
    page.get_by_role("button", name="Form from schema").click()
    expect(page.get_by_label("order_id (string, required)")).to_have_count(0)

    # A call made elsewhere shows up under Recent calls, with its Result on demand.
    live.invoke(tool["id"], {"order_id": "B-2"})
    show = page.get_by_role("button", name=re.compile("Show result of call"))
    expect(show).to_have_count(1)
    show.click()
    expect(page.locator(".result-box").last).to_contain_text("Order B-2 is shipped")


def test_agents_get_tools_enabled_pinned_and_removed(tab: Page, live: Live) -> None:
    tool = live.create_tool(name="pinned-tool", code=ORDER, input_schema=ORDER_SCHEMA)
    patched = live.http.patch(
        f"/v1/custom-tools/{tool['id']}", json={"description": "second version"}
    )
    assert patched.json()["data"]["version"] == 2
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="Agents").click()
    page.get_by_label("Agent name").fill("support-bot")
    page.get_by_role("button", name="Create agent").click()
    expect(page.get_by_role("status")).to_contain_text("Created agent support-bot")
    agent_id = page.get_by_label("Agent", exact=True).input_value()

    def enabled() -> list[dict[str, Any]]:
        res = live.http.get(f"/v1/agents/{agent_id}/custom-tools")
        assert res.status_code == 200, (agent_id, res.text)
        return list(res.json()["data"])

    page.get_by_label("Enable pinned-tool for support-bot").check()
    expect(page.get_by_role("status")).to_contain_text("enabled for support-bot (latest)")
    assert [(e["tool_id"], e["version"]) for e in enabled()] == [(tool["id"], None)]
    page.get_by_label("Version of pinned-tool for support-bot").select_option("1")
    expect(page.get_by_role("status")).to_contain_text("at version 1")
    assert [(e["tool_id"], e["version"]) for e in enabled()] == [(tool["id"], 1)]
    page.get_by_label("Enable pinned-tool for support-bot").uncheck()
    expect(page.get_by_role("status")).to_contain_text("no longer enabled")
    assert enabled() == []


def test_generate_opens_the_wizard_and_shows_why_it_cannot_run(tab: Page, live: Live) -> None:
    answer = live.http.post(
        "/v1/custom-tools/generate",
        json={"workspace_id": live.workspace_id, "description": "Add two numbers."},
    )
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="Generate").click()
    page.get_by_label("Describe the tool").fill("Add two numbers.")
    page.get_by_role("button", name="Generate").click()
    alert = page.locator(".wizard .form-alert")
    if answer.status_code in (404, 405):  # no generator on this service yet
        expect(alert).to_contain_text("TOOLKILN_LLM_BASE_URL")
    else:
        assert answer.status_code == 503, answer.text
        expect(alert).to_have_text(answer.json()["error"]["message"])
    # The form is there to fill by hand all the same.
    expect(page.get_by_role("textbox", name="Code")).to_be_visible()


def test_a_narrow_screen_shows_the_list_and_the_editor_without_sideways_scrolling(
    narrow: Page, live: Live
) -> None:
    live.create_tool(name="narrow-tool", code=ORDER, input_schema=ORDER_SCHEMA)
    page = narrow.page
    narrow.sign_in()
    link = page.get_by_role("link", name="narrow-tool", exact=True)
    expect(link).to_be_visible()
    expect(row_of(page, "narrow-tool").get_by_role("cell").nth(1)).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    narrow.shot("list-narrow.png")
    link.click()
    expect(page.get_by_role("textbox", name="Code")).to_be_visible()
    expect(page.get_by_role("button", name="Save")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_the_list_screenshot(tab: Page, live: Live) -> None:
    """The README's picture of the list: a few tools, one of them auto-disabled."""
    flaky = live.create_tool(name="inventory-check", code=FLAKY)
    live.create_tool(name="send-welcome-email", code=ORDER, input_schema=ORDER_SCHEMA)
    for _ in range(3):
        live.invoke(flaky["id"], {})
    page = tab.page
    tab.sign_in()
    expect(row_of(page, "inventory-check").get_by_role("cell").nth(1)).to_contain_text("disabled")
    tab.shot("list.png")


def test_test_cases_refuse_a_failing_save_and_run_on_demand(tab: Page, live: Live) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="New tool").click()
    page.get_by_label("Name").fill("cased-tool")
    set_code(page, ORDER)
    page.get_by_label("Parameters").fill(json.dumps(ORDER_SCHEMA))
    case = {"name": "ships", "input": {"order_id": "A-1"}, "expect": {"message": "wrong"}}
    page.get_by_label("Test cases").fill(json.dumps([case]))
    page.get_by_role("button", name="Save").click()
    report = page.get_by_role("list", name="Test case results")
    expect(report).to_contain_text("failed: ships")
    expect(report).to_contain_text("Order A-1 is shipped")
    names = [t["name"] for t in live.http.get("/v1/custom-tools").json()["data"]]
    assert "cased-tool" not in names

    case["expect"] = {"message": "Order A-1 is shipped"}
    page.get_by_label("Test cases").fill(json.dumps([case]))
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Tool: cased-tool")).to_be_visible()
    page.get_by_role("button", name="Run cases").click()
    expect(page.get_by_text("Version 1: 1 passed, 0 failed")).to_be_visible()
    expect(page.get_by_role("list", name="Test case results")).to_contain_text("passed: ships")


def focused_name(page: Any) -> str:
    return str(
        page.evaluate(
            "() => { const e = document.activeElement; return e.getAttribute('aria-label')"
            " || (e.labels && e.labels[0] && e.labels[0].textContent) || e.textContent || ''; }"
        )
    ).strip()


def test_the_keyboard_alone_signs_in_opens_a_new_tool_and_leaves_the_editor(
    tab: Page, live: Live
) -> None:
    page = tab.page
    page.goto(f"{live.url}/ui")
    expect(page.get_by_label("Token")).to_be_focused()
    page.keyboard.type(TOKEN)
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    for _ in range(15):
        if focused_name(page) == "New tool":
            break
        page.keyboard.press("Tab")
    assert focused_name(page) == "New tool"
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="New tool")).to_be_visible()
    # Tab indents inside the editor; Escape then Tab moves on (no keyboard trap).
    page.get_by_role("textbox", name="Code").focus()
    page.keyboard.press("Escape")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Parameters")).to_be_focused()


def test_problems_are_marked_as_you_type_without_saving(tab: Page, live: Live) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="New tool").click()
    page.get_by_label("Name").fill("typed-tool")
    set_code(page, "def main(**params):\n    x = [1,\n    return {'message': 'x'}\n")
    code_error = page.locator("[data-field=code] .field-error")
    expect(code_error).to_contain_text("SyntaxError")
    expect(page.locator(".cm-lintRange-error")).to_have_count(1)
    page.get_by_label("Name").fill("Typed Tool")
    expect(page.locator("[data-field=name] .field-error")).not_to_be_empty()
    set_code(page, "def main(**params):\n    return {'message': 'x'}\n")
    expect(code_error).to_be_empty()
    expect(page.locator(".cm-lintRange-error")).to_have_count(0)
    names = [t["name"] for t in live.http.get("/v1/custom-tools").json()["data"]]
    assert "typed-tool" not in names and "Typed Tool" not in names


def test_a_javascript_tool_from_its_template_is_saved_and_test_run(tab: Page, live: Live) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="New tool").click()
    editor = page.get_by_role("textbox", name="Code")
    expect(editor).to_contain_text("def main(**params):")
    page.get_by_label("Language").select_option("javascript")
    expect(editor).to_contain_text("async function main(params) {")
    page.get_by_label("Name").fill("hello-js")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Tool: hello-js")).to_be_visible()
    expect(page.get_by_label("Language")).to_have_value("javascript")
    page.get_by_label("Input").fill('{"name": "Ada"}')
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-status")).to_have_text("ok")
    expect(page.get_by_test_id("result-message")).to_have_text("Hello, Ada!")
    # A JavaScript syntax error is marked at its line too.
    set_code(page, "async function main(params) {\n  return { message: ( };\n}\n")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("[data-field=code] .field-error")).to_contain_text("line 2")
    tool_id = page.url.rsplit("/", 1)[1]
    assert live.tool(tool_id).json()["data"]["version"] == 1


def test_a_tool_deleted_elsewhere_says_so_on_its_page(tab: Page, live: Live) -> None:
    tool = live.create_tool(name="short-lived", code=ORDER, input_schema=ORDER_SCHEMA)
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="short-lived", exact=True).click()
    expect(page.get_by_role("heading", name="Tool: short-lived")).to_be_visible()
    assert live.http.delete(f"/v1/custom-tools/{tool['id']}").status_code == 204
    gone = live.tool(tool["id"])
    assert gone.status_code == 404
    expect(page.get_by_role("alert").first).to_have_text(gone.json()["error"]["message"])


def test_where_agents_are_offered_a_tool_is_set_on_its_form(tab: Page, live: Live) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="New tool").click()
    page.get_by_label("Name").fill("code-only-tool")
    expect(page.get_by_label("As a tool of its own (direct calls)")).to_be_checked()
    expect(page.get_by_label("Inside code mode (run_program)")).to_be_checked()
    page.get_by_label("As a tool of its own (direct calls)").uncheck()
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Tool: code-only-tool")).to_be_visible()
    tool_id = page.url.rsplit("/", 1)[1]
    assert live.tool(tool_id).json()["data"]["allowed_callers"] == ["code"]
    # Offered nowhere is refused, next to the field, and nothing is stored.
    page.get_by_label("Inside code mode (run_program)").uncheck()
    page.get_by_role("button", name="Save").click()
    expect(page.locator("[data-field=allowed_callers] .field-error")).not_to_be_empty()
    assert live.tool(tool_id).json()["data"]["version"] == 1
    page.reload()
    expect(page.get_by_label("As a tool of its own (direct calls)")).not_to_be_checked()
    expect(page.get_by_label("Inside code mode (run_program)")).to_be_checked()


def test_save_does_not_overwrite_a_version_saved_elsewhere_meanwhile(tab: Page, live: Live) -> None:
    tool = live.create_tool(name="two-editors", code=ORDER, input_schema=ORDER_SCHEMA)
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="two-editors", exact=True).click()
    expect(page.get_by_role("heading", name="Tool: two-editors")).to_be_visible()
    # Someone else saves version 2 while this form holds version 1.
    theirs = ORDER.replace("is shipped", "has shipped")
    r = live.http.patch(f"/v1/custom-tools/{tool['id']}", json={"code": theirs})
    assert r.status_code == 200 and r.json()["data"]["version"] == 2
    page.get_by_label("Description").fill("Mine.")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".form-alert").first).to_contain_text("changed elsewhere")
    after = live.tool(tool["id"]).json()["data"]
    assert after["version"] == 2 and after["code"] == theirs and after["description"] == ""
    # Reloaded, the form holds version 2 and saves on it.
    page.reload()
    page.get_by_label("Description").fill("Mine.")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").first).to_contain_text("Saved: version 3")
    after = live.tool(tool["id"]).json()["data"]
    assert after["code"] == theirs and after["description"] == "Mine."


def test_a_malformed_address_shows_the_apis_message_and_no_page_error(
    tab: Page, live: Live
) -> None:
    page = tab.page
    tab.sign_in()
    expect(page.get_by_role("heading", name="Custom tools")).to_be_visible()
    page.goto(f"{live.url}/ui#/tools/%E0%A4%A")  # not valid percent-encoding
    expect(page.get_by_role("alert").first).to_contain_text("tool")
    assert tab.errors == []
