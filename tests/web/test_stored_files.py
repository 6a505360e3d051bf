"""Class: nothing a tool stores runs as script on the view's origin.

``surface_file`` stores bytes a tool chose and serves them from the service's own origin,
the origin of ``/ui`` (where the signed-in token lives). A ``.js`` file was served as
``text/javascript`` and the view's policy said ``script-src 'self'``, so markup that got
into the page (none is known today: this is the second wall) could load it and read the
token. Here stored ``.js``, ``.html`` and ``.svg`` files (each setting ``__ran`` on every
window it can reach) are loaded into a signed-in ``/ui`` every way injected markup could: a
classic script, a module script, an iframe, an object, an embed, an image, and a
navigation to the file. Nothing may run; the checks wait for each element's load or error
event (or a deadline), then look at every window.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from tests.web.conftest import Live, Page

MARK = (
    "for (const w of [window, window.parent, window.top]) "
    "{ try { w.__ran = (w.__ran || []).concat(['KIND']); } catch (e) {} }"
)
FILES = {
    "js": ("payload.js", MARK.replace("KIND", "js"), None),
    "mjs": ("payload.mjs", MARK.replace("KIND", "mjs"), "text/javascript"),
    "html": (
        "payload.html",
        f"<!doctype html><script>{MARK.replace('KIND', 'html')}</script>",
        None,
    ),
    "svg": (
        "payload.svg",
        '<svg xmlns="http://www.w3.org/2000/svg"><script>'
        + MARK.replace("KIND", "svg")
        + "</script></svg>",
        None,
    ),
}
SURFACE = """
FILES = {files!r}

async def handle(input, ctx):
    urls = {{}}
    for kind, (filename, content, mime) in FILES.items():
        payload = {{"filename": filename, "content": content}}
        if mime:
            payload["mime_type"] = mime
        urls[kind] = (await ctx.tools.surface_file(payload))["url"]
    return {{"message": "stored", "rawData": urls}}
"""

# Injected markup, made by script here only to stand in for an HTML injection: each element
# is added without the page's script nonce, as markup from a tool's output would be.
LOAD_EVERY_WAY = """async (urls) => {
  const made = [];
  const add = (tag, attrs) => new Promise((resolve) => {
    const el = document.createElement(tag);
    const done = (how) => () => resolve(`${tag} ${attrs.src || attrs.data}: ${how}`);
    el.addEventListener('load', done('load'));
    el.addEventListener('error', done('error'));
    setTimeout(done('no event within 3 s'), 3000);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    document.body.append(el);
    made.push(el);
  });
  const outcomes = [];
  for (const url of [urls.js, urls.mjs, urls.html, urls.svg]) {
    outcomes.push(await add('script', {src: url}));
    outcomes.push(await add('script', {src: url, type: 'module'}));
  }
  for (const url of [urls.html, urls.svg]) {
    outcomes.push(await add('iframe', {src: url}));
    outcomes.push(await add('object', {data: url}));
    outcomes.push(await add('embed', {src: url}));
  }
  outcomes.push(await add('img', {src: urls.svg}));
  // The policy alone, whatever a file's type: the view's own bundle, without the nonce.
  outcomes.push(await add('script', {src: '/ui/assets/app.js'}));
  return outcomes;
}"""


@pytest.fixture(scope="module")
def stored(live: Live) -> dict[str, str]:
    """Each stored file's link as a path on the view's origin (the links name the service's
    configured public URL, which the test's service on its free port does not use)."""
    tool = live.create_tool(name="file-planter", code=SURFACE.format(files=FILES))
    result = live.invoke(tool["id"], {})
    assert result["status"] == "ok", result
    links = {kind: urlsplit(url) for kind, url in result["raw_data"].items()}
    return {kind: f"{u.path}?{u.query}" for kind, u in links.items()}


def test_stored_script_html_and_svg_never_run_in_the_view(
    tab: Page, live: Live, stored: dict[str, str]
) -> None:
    page = tab.page
    tab.expect_csp_violations = True  # the policy refusing the injected elements is expected
    tab.sign_in()
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    outcomes = page.evaluate(LOAD_EVERY_WAY, stored)
    assert tab.outside == [], tab.outside  # every element asked the view's own origin
    ran = page.evaluate(
        """() => [window.__ran, ...[...document.querySelectorAll('iframe')].map((f) => {
            try { return f.contentWindow.__ran; } catch (e) { return undefined; } })]"""
    )
    assert all(r is None for r in ran), (ran, outcomes)
    assert outcomes[-1].endswith(": error"), outcomes[-1]  # script-src admits the nonce alone
    assert any(v.startswith("script-src") for v in tab.csp_violations), tab.csp_violations
    # The view itself still works: its own bundle is the one script that ran.
    expect(page.get_by_role("button", name="New tool")).to_be_visible()
    assert page.evaluate("[...document.scripts].filter((s) => s.nonce).length") == 1


@pytest.mark.parametrize("kind", ["html", "svg", "js"])
def test_opening_a_stored_file_downloads_it_and_runs_nothing(
    tab: Page, live: Live, stored: dict[str, str], kind: str
) -> None:
    page = tab.page
    with page.expect_download() as download:
        try:
            page.goto(live.url + stored[kind])
        except PlaywrightError as exc:  # a navigation that became a download is "aborted"
            assert "Download is starting" in str(exc) or "ERR_ABORTED" in str(exc), exc
    assert download.value.suggested_filename == f"payload.{kind}"
    assert page.evaluate("window.__ran") is None


def test_stored_files_are_served_as_types_that_never_run(
    live: Live, stored: dict[str, Any]
) -> None:
    for kind, url in stored.items():
        res = live.http.get(url)
        assert res.status_code == 200, (kind, res.text)
        assert res.headers["content-type"] == "application/octet-stream", kind
        assert res.headers["content-disposition"].startswith("attachment;"), kind
        assert res.headers["x-content-type-options"] == "nosniff", kind
        assert "sandbox" in res.headers["content-security-policy"], kind
