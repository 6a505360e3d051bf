"""The view's egress forms in Chromium: the tool form edits a version's egress list (a bad
entry is shown at the field, a change makes a version that shows in the diff), and the
Secrets page adds, lists, changes and deletes secrets without ever showing a value."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.web.conftest import Live, Page

ECHO = "def main(**params):\n    return {'message': 'ok'}\n"


def test_the_tool_form_edits_egress(tab: Page, live: Live) -> None:
    tool = live.create_tool(name="reaches-out", code=ECHO, egress=["api.example.com"])
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="reaches-out", exact=True).click()
    hosts = page.get_by_label("Egress hosts")
    expect(hosts).to_have_value("api.example.com")
    tab.shot("egress-field.png", page.locator("[data-field=egress]"))
    hosts.fill("api.example.com\nuser@evil.example")
    page.get_by_role("button", name="Save").click()
    error = page.locator("[data-field=egress] .field-error")
    expect(error).to_contain_text("'user@evil.example'")
    assert live.tool(tool["id"]).json()["data"]["egress"] == ["api.example.com"]

    hosts.fill("api.example.com\n*.example.org:8443")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved: version 2")
    assert live.tool(tool["id"]).json()["data"]["egress"] == [
        "api.example.com",
        "*.example.org:8443",
    ]
    page.get_by_label("From version").select_option("1")
    page.get_by_label("To version").select_option("2")
    page.get_by_role("button", name="Show diff").click()
    diff = page.get_by_label("Changes from version 1 to 2")
    expect(diff.locator(".diff-add")).to_contain_text("*.example.org:8443")


def test_the_secrets_page_never_shows_a_value(tab: Page, live: Live) -> None:
    value = "sk-view-0a1b2c3d4e5f"
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="Secrets").click()
    expect(page.get_by_role("heading", name="Secrets")).to_be_visible()
    form = page.get_by_role("form", name="New secret")
    form.get_by_label("Name").fill("API_KEY")
    form.get_by_label("Value").fill(value)
    form.get_by_label("Hosts").fill("api.example.com")
    form.get_by_role("button", name="Add secret").click()
    expect(page.get_by_role("status")).to_have_text("Added API_KEY.")
    expect(form.get_by_label("Value")).to_have_value("")
    table = page.get_by_role("table", name="Secrets of this workspace")
    row = table.get_by_role("row").filter(has_text="API_KEY")
    expect(row.get_by_role("cell").nth(0)).to_have_text("api.example.com")
    expect(row.get_by_role("cell").nth(2)).to_have_text("never")
    assert value not in page.content()
    tab.shot("secrets.png")

    form.get_by_label("Name").fill("BAD")
    form.get_by_label("Value").fill("v")
    form.get_by_label("Hosts").fill("not a host")
    form.get_by_role("button", name="Add secret").click()
    expect(page.locator("[data-field=hosts] .field-error")).to_contain_text("'not a host'")

    page.get_by_label("Hosts of API_KEY").fill("api.example.com\n*.example.net")
    page.get_by_label("New value of API_KEY").fill("sk-view-rotated-99")
    page.get_by_role("button", name="Save API_KEY").click()
    expect(page.get_by_role("status")).to_have_text("Saved API_KEY.")
    expect(row.get_by_role("cell").nth(0)).to_have_text("api.example.com, *.example.net")
    assert "sk-view-rotated-99" not in page.content() and value not in page.content()
    listed = live.http.get(f"/v1/workspaces/{live.workspace_id}/secrets").json()["data"]
    assert [s["hosts"] for s in listed] == [["api.example.com", "*.example.net"]]

    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete API_KEY").click()
    expect(page.get_by_role("status")).to_have_text("Deleted API_KEY.")
    expect(table).to_contain_text("No secrets yet.")
