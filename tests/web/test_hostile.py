"""Everything a tool or another user controls is shown, never run (CONTRACT section 10).

Script is planted in each place the view shows: a tool's description and last_error, the
Result's message, raw data, llm text, logs (stdout and stderr), every kind of _render (markdown with raw HTML and
javascript: links, tables, images, file links), _interactive labels, and the event and data of
the audit rows tool code writes. The checks look at
the DOM itself (no planted element, handler or link exists), not only at whether the CSP
happened to block it, and then at the CSP too.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.web.conftest import Live, Page

X = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
LABEL = "<img src=x onerror=window.__pwned=3>"

HOSTILE = f"""
X = {X!r}
LABEL = {LABEL!r}

def main(*, ctx, **params):
    import sys
    print(X)
    print(LABEL, file=sys.stderr)
    kind = params.get("kind", "markdown")
    out = {{"message": X, "rawData": {{"html": X}}, "_llm": X}}
    if kind == "markdown":
        out["_render"] = {{"type": "markdown", "markdown": "# Title\\n\\n" + X
            + "\\n\\n[click](javascript:window.__pwned=4) [ok](https://example.org/a)"
            + " ![p](http://127.0.0.1:9/x.png) ![q](data:image/png;base64,AAAA)"
            + '\\n\\n<a href="javascript:window.__pwned=5">raw</a> <iframe src="/ui"></iframe>'}}
    elif kind == "table":
        out["_render"] = {{"type": "table", "columns": [X, "n"], "rows": [[X, 1], [LABEL, 2]]}}
    elif kind == "image":
        out["_render"] = {{"type": "image", "url": "http://127.0.0.1:9/x.png", "alt": X}}
    elif kind == "https-image":
        out["_render"] = {{"type": "image", "url": "https://images.example/cat.png", "alt": "cat"}}
    elif kind == "file":
        out["_render"] = {{"type": "file", "url": "https://files.example/a", "filename": X}}
    elif kind == "buttons":
        out["_interactive"] = {{"type": "buttons", "prompt": X, "buttons": [
            {{"label": LABEL, "action": {{"type": "open_url", "url": "https://example.org/"}}}},
            {{"label": "Save", "action": {{"type": "message", "text": X}}}}]}}
    elif kind == "form":
        out["_interactive"] = {{"type": "form", "prompt": X,
            "fields": [{{"name": "a", "label": LABEL, "type": "text"}}],
            "submit": {{"label": LABEL, "action": {{"type": "message", "text": "hi"}}}}}}
    elif kind == "audit":
        ctx.audit(LABEL, {{"html": X, "label": LABEL}})
    elif kind == "raise":
        raise ValueError(X)
    return out
"""

NOTHING_RAN = """() => {
  const bad = [];
  if (window.__pwned !== undefined) bad.push('pwned ' + window.__pwned);
  const scripts = [...document.scripts].map((s) => s.src);
  if (scripts.length !== 1 || !scripts[0].endsWith('/ui/assets/app.js')) bad.push('scripts ' + scripts);
  for (const el of document.querySelectorAll('*')) {
    for (const a of el.attributes) {
      if (a.name.startsWith('on')) bad.push('handler ' + el.tagName + ' ' + a.name);
    }
    if (['IFRAME', 'OBJECT', 'EMBED', 'SCRIPT'].includes(el.tagName) && el.src !== scripts[0]) bad.push('element ' + el.tagName);
  }
  for (const a of document.querySelectorAll('a[href]')) {
    const u = new URL(a.getAttribute('href'), location.href);
    if (!['http:', 'https:', 'mailto:'].includes(u.protocol)) bad.push('link ' + a.getAttribute('href'));
  }
  for (const img of document.querySelectorAll('img')) {
    const u = new URL(img.getAttribute('src'), location.href);
    if (u.origin !== location.origin) bad.push('image ' + img.src);
  }
  return bad;
}"""


@pytest.fixture(scope="module")
def hostile(live: Live) -> dict:
    schema = {"type": "object", "properties": {"kind": {"type": "string"}}}
    tool = live.create_tool(name="hostile-tool", description=X, code=HOSTILE, input_schema=schema)
    assert live.invoke(tool["id"], {"kind": "raise"})["error"]["code"] == "runtime_error"
    return tool


def run(tab: Page, kind: str) -> None:
    page = tab.page
    page.get_by_label("Input").fill(f'{{"kind": "{kind}"}}')
    page.get_by_role("button", name="Test").click()
    expect(page.get_by_test_id("result-status")).to_have_text("ok" if kind != "raise" else "error")


def test_list_and_tool_page_show_hostile_names_and_errors_as_text(
    tab: Page, live: Live, hostile: dict
) -> None:
    page = tab.page
    tab.sign_in()
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="hostile-tool"))
    expect(row.get_by_role("cell").nth(4)).to_contain_text(X)
    assert page.evaluate(NOTHING_RAN) == []
    page.get_by_role("link", name="hostile-tool").click()
    expect(page.get_by_label("Description")).to_have_value(X)
    expect(page.locator(".tool-status .last-error")).to_contain_text(X)
    expect(page.get_by_role("button", name="Show result of call").first).to_be_visible()
    page.get_by_role("button", name="Show result of call").first.click()
    expect(page.locator(".result-box").last).to_contain_text(X)
    assert page.evaluate(NOTHING_RAN) == []


def test_audit_rows_written_by_tool_code_are_shown_as_text(
    tab: Page, live: Live, hostile: dict
) -> None:
    assert live.invoke(hostile["id"], {"kind": "audit"})["status"] == "ok"
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="hostile-tool").click()
    audit = page.get_by_role("table", name="Audit rows of this tool, newest first")
    planted = audit.get_by_role("row").filter(has_text=f"custom.{LABEL}")
    expect(planted).to_have_count(1)
    cells = planted.get_by_role("cell")
    expect(cells.nth(1)).to_have_text(f"custom.{LABEL}")
    expect(cells.nth(4)).to_contain_text(X.replace('"', '\\"'))  # the outcome: one line of JSON
    cells.nth(5).get_by_text("Data", exact=True).click()
    expect(cells.nth(5).locator("pre")).to_contain_text(X.replace('"', '\\"'))
    assert page.evaluate(NOTHING_RAN) == []


@pytest.mark.parametrize(
    "kind", ["markdown", "table", "image", "https-image", "file", "buttons", "form", "raise"]
)
def test_every_part_of_a_result_is_shown_and_never_run(
    tab: Page, live: Live, hostile: dict, kind: str
) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="hostile-tool").click()
    run(tab, kind)
    result = page.locator("dl.result")
    expect(result).to_contain_text(X)  # message and raw data, as text
    if kind != "raise":  # a raised error's logs are the runtime's concern
        expect(page.get_by_test_id("result-logs")).to_contain_text(X)
        expect(page.get_by_test_id("result-logs")).to_contain_text(LABEL)
    assert page.evaluate(NOTHING_RAN) == []
    if kind == "markdown":
        md = result.locator(".markdown")
        expect(md.get_by_role("heading", name="Title")).to_be_visible()
        expect(md.get_by_role("link", name="ok")).to_have_attribute("href", "https://example.org/a")
        expect(md.get_by_text("click")).to_be_visible()  # shown, but not a link
        expect(md.get_by_role("link", name="click")).to_have_count(0)
        expect(md).to_contain_text("[image not shown")
        expect(md.locator("img")).to_have_count(0)
    elif kind == "table":
        expect(result.get_by_role("columnheader").first).to_have_text(X)
        expect(result.get_by_role("cell", name=LABEL)).to_be_visible()
    elif kind == "image":
        expect(result).to_contain_text("[image not shown")
        expect(result.locator("img")).to_have_count(0)
    elif kind == "https-image":  # not loaded (a tracking pixel would see the reader): a link
        expect(result.locator("img")).to_have_count(0)
        expect(result).to_contain_text("[image not shown: cat]")
        expect(result.get_by_role("link", name="open image")).to_have_attribute(
            "href", "https://images.example/cat.png"
        )
    elif kind == "file":
        expect(result.get_by_role("link", name=X)).to_have_attribute(
            "href", "https://files.example/a"
        )
    elif kind in ("buttons", "form"):
        expect(result.locator(".interactive")).to_contain_text(LABEL)
        # Labels are text, never buttons that could stand in for the view's own.
        expect(result.get_by_role("button")).to_have_count(0)
        expect(page.get_by_role("button", name="Save", exact=True)).to_have_count(1)
    # The browser asked nothing of any other host, images included.
    assert tab.outside == []


def test_the_policy_blocks_inline_script_eval_and_framing(tab: Page, live: Live) -> None:
    page = tab.page
    tab.expect_csp_violations = True
    tab.sign_in()
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    page.evaluate(
        """() => { const s = document.createElement('script');
        s.textContent = 'window.__pwned = "inline"'; document.body.append(s); }"""
    )
    # An inline handler and a string timer (eval by another name) are refused too.
    page.evaluate(
        """() => { document.body.setAttribute('onclick', 'window.__pwned = "handler"');
        document.body.click(); setTimeout('window.__pwned = "timer"', 0);
        setTimeout(() => { window.__done = true; }, 10); }"""
    )
    page.wait_for_function("window.__done === true")
    assert page.evaluate("window.__pwned") is None
    frame_page = page.context.new_page()
    frame_page.set_content(f'<iframe src="{live.url}/ui"></iframe>')
    frame_page.wait_for_load_state()
    assert len(tab.csp_violations) >= 3  # the script, the handler, the timer
    assert frame_page.frame_locator("iframe").get_by_label("Token").count() == 0


def test_a_calls_result_is_its_own_workspaces_even_when_another_reused_its_id(
    tab: Page, live: Live
) -> None:
    """Call ids are the callers' own and unique per workspace only: another workspace that
    reused this call's id had its result shown as this tool's to an admin (until
    2026-12-06, the view asked for the id without the tool's workspace)."""
    ours = live.create_tool(
        name="id-owner", code="def main(**p):\n    return {'message': 'the real result'}\n"
    )
    made = live.http.post("/v1/workspaces", json={"name": "id-reuser"})
    assert made.status_code == 201, made.text
    other = made.json()["data"]["id"]
    body = {"workspace_id": other, "language": "python", "name": "spoof"}
    spoof = live.http.post(
        "/v1/custom-tools",
        json={**body, "code": "def main(**p):\n    return {'message': 'SPOOFED elsewhere'}\n"},
    ).json()["data"]
    call = {"input": {}, "tool_call_id": "call_shared_1"}
    for tool in (ours, spoof):  # the other workspace's call is the newer one
        res = live.http.post(f"/v1/custom-tools/{tool['id']}/invoke", json=call)
        assert res.status_code == 200 and res.json()["data"]["status"] == "ok", res.text
    page = tab.page
    tab.sign_in()
    page.get_by_role("link", name="id-owner").click()
    show = page.get_by_role("button", name="Show result of call call_shared_1")
    expect(show).to_have_count(1)
    show.click()
    expect(page.locator(".result-box").last).to_contain_text("the real result")
    expect(page.locator(".result-box").last).not_to_contain_text("SPOOFED")
