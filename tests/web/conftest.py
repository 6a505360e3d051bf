"""The view in a real Chromium (Debian's package, driven by Playwright) against a live service.

One service per test module: uvicorn on a loopback port in a thread, SQLite in a temporary
data dir, the real sandbox. The browser may reach nothing but that service: every other
request is aborted, and name resolution fails for any other host.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import serving
from toolkiln.app import Runtime, build
from toolkiln.config import Settings

CHROMIUM = os.environ.get("TOOLKILN_CHROMIUM", "/usr/bin/chromium")
TOKEN = "view-test-admin-token"
ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "src" / "toolkiln" / "web" / "static" / "app.js"
# Screenshots land here when set (the README's pictures: TOOLKILN_UI_SCREENSHOTS=docs/img).
SHOTS = os.environ.get("TOOLKILN_UI_SCREENSHOTS")


# Every policy violation on a page is reported to the test (init scripts bypass the policy).
REPORT_CSP = """document.addEventListener('securitypolicyviolation', (e) => {
  const t = e.target;
  const inEditor = Boolean(t && t.closest && (t.closest('.cm-content') || t.closest('.cm-line')));
  window.__cspViolation(e.violatedDirective, inEditor, e.sample || '');
});"""


@dataclass
class Live:
    """A running service, an admin token, its default workspace, and an API client."""

    runtime: Runtime
    url: str
    workspace_id: str
    http: httpx.Client

    def create_tool(self, **fields: Any) -> dict[str, Any]:
        body = {"workspace_id": self.workspace_id, "language": "python", **fields}
        res = self.http.post("/v1/custom-tools", json=body)
        assert res.status_code == 201, res.text
        return dict(res.json()["data"])

    def invoke(self, tool_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        res = self.http.post(f"/v1/custom-tools/{tool_id}/invoke", json={"input": payload})
        assert res.status_code == 200, res.text
        return dict(res.json()["data"])

    def tool(self, tool_id: str) -> httpx.Response:
        return self.http.get(f"/v1/custom-tools/{tool_id}")


@contextmanager
def serve(data_dir: Path, **settings: Any) -> Iterator[Live]:
    """A live service on a loopback port with the admin token TOKEN."""
    if not BUNDLE.is_file():
        pytest.fail("The view's bundle is not built: run `make install` (npm ci + esbuild).")
    rt = build(Settings(data_dir=data_dir, sandbox_warm=2, sandbox_js_workers=1, **settings))
    rt.services.access.bootstrap(TOKEN)
    try:
        with serving(rt) as url:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
                workspace = http.get("/v1/workspaces").json()["data"][0]["id"]
                yield Live(rt, url, workspace, http)
    finally:
        rt.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with serve(tmp_path_factory.mktemp("view")) as service:
        yield service


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) or os.path.isfile(CHROMIUM)):
        pytest.fail(f"No Chromium at {CHROMIUM}: `make test` installs Debian's chromium package.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


class Page:
    """A browser tab on the view, with what it must never see: errors, outside requests."""

    def __init__(self, page: Any, live: Live) -> None:
        self.page = page
        self.live = live
        self.errors: list[str] = []
        self.outside: list[str] = []
        # The view itself never trips its own policy; a test that does on purpose says so.
        self.csp_violations: list[str] = []
        self.expect_csp_violations = False
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def report(self, directive: str, in_editor: bool, sample: str) -> None:
        # Chrome's own contenteditable editing may write a style attribute into the editor's
        # lines (the policy refuses it and CodeMirror redraws the line): not the view's doing.
        if not (directive == "style-src-attr" and in_editor):
            self.csp_violations.append(f"{directive}: {sample}")

    def sign_in(self, token: str = TOKEN) -> None:
        self.page.goto(f"{self.live.url}/ui")
        self.page.get_by_label("Token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()

    def shot(self, name: str, locator: Any = None) -> None:
        """A picture for the docs (only when TOOLKILN_UI_SCREENSHOTS names a folder)."""
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            target = locator if locator is not None else self.page
            target.screenshot(path=str(Path(SHOTS) / name))


def set_code(page: Any, text: str) -> None:
    """Replace the editor's text the way a paste does (no auto-indent on the way in)."""
    from playwright.sync_api import expect

    editor = page.get_by_role("textbox", name="Code")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)
    expect(editor).to_contain_text(text.splitlines()[0])


@contextmanager
def new_tab(browser: Any, live: Live, width: int = 1280, height: int = 900) -> Iterator[Page]:
    """A tab in a context of its own that may reach only the service; on leaving, it fails
    the test on any page error or policy violation it saw."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(15_000)
    page = context.new_page()
    wrapped = Page(page, live)

    def only_the_service(route: Any) -> None:
        if route.request.url.startswith(live.url):
            route.continue_()
        else:
            wrapped.outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_service)
    context.expose_function("__cspViolation", wrapped.report)
    context.add_init_script(REPORT_CSP)
    try:
        yield wrapped
    finally:
        context.close()
    assert not wrapped.errors, wrapped.errors
    if not wrapped.expect_csp_violations:
        assert not wrapped.csp_violations, wrapped.csp_violations


@pytest.fixture
def tab(browser: Any, live: Live) -> Iterator[Page]:
    with new_tab(browser, live) as wrapped:
        yield wrapped


@pytest.fixture
def narrow(browser: Any, live: Live) -> Iterator[Page]:
    """A tab as wide as a phone's screen (390 px)."""
    with new_tab(browser, live, width=390, height=844) as wrapped:
        yield wrapped
