"""The Custom Tools view: a static page and its bundle under ``/ui``.

The page holds no data of its own: it signs in with a token and talks to ``/v1`` like any
client. The bundle is built from ``frontend/`` at install time (``make install``); this
module serves it with a Content-Security-Policy that lets only the shipped script run (by a
fresh nonce per page, not by origin: the origin also serves the files tools store).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

STATIC = Path(__file__).resolve().parent / "static"


# Script: the shipped bundle alone, by the nonce its one script element carries in this
# response. Not 'self': the service's origin also serves what tools store (/v1/files), and
# under 'self' a stored .js file loaded by injected markup would run with the token in reach
# (tests/web/test_stored_files.py). No inline script, no eval, no framing, no workers; data
# goes only to this origin; images only from here (surfaced files): an image elsewhere,
# which a tool's _render or markdown may name, would tell its host who looked at a result
# and when, so the view shows it as a link instead. Styles: the shipped sheet, and the one
# style element CodeMirror writes, which carries this response's style nonce (the page never
# inserts markup, so nothing else can carry it).
def csp(nonce: str, script_nonce: str) -> str:
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src 'nonce-{script_nonce}'",
            f"style-src 'self' 'nonce-{nonce}'",
            "img-src 'self'",
            "connect-src 'self'",
            "font-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ]
    )


# The assets' headers; the page itself gets csp() with a fresh nonce.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "charts.css": "text/css; charset=utf-8",  # the chart library's sheet, bundled (frontend/)
}

NOT_BUILT = (
    "The Custom Tools view is not built: run `make install` (it runs npm ci and the esbuild "
    "bundle in frontend/)."
)


def mount(app: FastAPI, static: Path = STATIC) -> None:
    """Add ``GET /ui``, ``GET /ui/assets/{name}`` and ``GET /`` (a redirect to the view) to the
    app, none of them in the OpenAPI document."""

    template = (static / "index.html").read_text(encoding="utf-8")

    def page() -> Response:
        if not (static / "app.js").is_file():
            return PlainTextResponse(NOT_BUILT, status_code=503, headers=HEADERS)
        nonce, script_nonce = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
        headers = {**HEADERS, "Content-Security-Policy": csp(nonce, script_nonce)}
        html = template.replace("{{nonce}}", nonce).replace("{{script_nonce}}", script_nonce)
        return HTMLResponse(html, headers=headers)

    def asset(name: str) -> Response:
        kind = ASSETS.get(name)
        path = static / name
        if kind is None or not path.is_file():
            return PlainTextResponse("Not found.", status_code=404, headers=HEADERS)
        return FileResponse(path, media_type=kind, headers=HEADERS)

    def home() -> Response:
        return RedirectResponse("/ui", status_code=307, headers=HEADERS)

    app.add_api_route("/", home, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui", page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/", page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/assets/{name}", asset, methods=["GET"], include_in_schema=False)
