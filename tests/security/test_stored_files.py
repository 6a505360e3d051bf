"""Class: nothing a tool stores is served as active content from the view's origin.

``surface_file`` serves bytes a tool chose from the service's own origin, the origin of
``/ui``. Every type a browser can run (script, module, style sheet, document, SVG, XML,
XSLT, WebAssembly, a manifest, types it would guess from the name) must be served as a type
that never runs, as an attachment, never sniffed, in a sandbox with no sources; images (but
SVG), audio, video and plain data keep their type. And the view admits only its own bundle
as script (a nonce, not ``'self'``) and loads images only from its own origin.
``tests/web/test_stored_files.py`` shows the same in a browser.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from tests.security.conftest import Target

ACTIVE = [  # (filename, mime_type given or None: guessed from the name)
    ("a.js", None),
    ("a.mjs", None),
    ("a.js", "application/javascript"),
    ("a.txt", "text/javascript"),
    ("a.html", None),
    ("a.htm", "text/html"),
    ("a.xhtml", None),
    ("a.svg", None),
    ("a.png", "image/svg+xml"),
    ("a.png", "IMAGE/SVG+XML"),
    ("a.xml", None),
    ("a.xsl", "text/xsl"),
    ("a.css", None),
    ("a.wasm", "application/wasm"),
    ("a.webmanifest", "application/manifest+json"),
    ("a.txt", "multipart/x-mixed-replace"),
    ("noext", None),
]
INERT = [
    ("a.png", None, "image/png"),
    ("a.txt", None, "text/plain; charset=utf-8"),
    ("a.csv", None, "text/csv; charset=utf-8"),
    ("a.json", None, "application/json"),
    ("a.pdf", None, "application/pdf"),
    ("a.bin", "audio/mpeg", "audio/mpeg"),
]
SURFACE = {
    "python": (
        "async def handle(input, ctx):\n"
        "    payload = {'filename': input['filename'], 'content': input['content']}\n"
        "    if input.get('mime_type'):\n"
        "        payload['mime_type'] = input['mime_type']\n"
        "    return {'message': (await ctx.tools.surface_file(payload))['url']}\n"
    ),
    "javascript": (
        "async function handle(input, ctx) {\n"
        "  const payload = {filename: input.filename, content: input.content};\n"
        "  if (input.mime_type) payload.mime_type = input.mime_type;\n"
        "  return {message: (await ctx.tools.surface_file(payload)).url};\n"
        "}\n"
    ),
}
CONTENT = "<script>alert(document.domain)</script>"


def _served(target: Target, language: str, filename: str, mime: str | None) -> dict[str, str]:
    given = {"filename": filename, "content": CONTENT, **({"mime_type": mime} if mime else {})}
    result = target.run(SURFACE[language], given, name="planter", language=language)
    assert result["status"] == "ok", result
    link = urlsplit(result["message"])
    res = target.client.get(f"{link.path}?{link.query}")
    assert res.status_code == 200, res.text
    assert res.content == CONTENT.encode()
    return dict(res.headers)


@pytest.mark.parametrize("language", ["python", "javascript"])
@pytest.mark.parametrize(("filename", "mime"), ACTIVE)
def test_an_active_type_is_served_as_bytes_that_never_run(
    target: Target, language: str, filename: str, mime: str | None
) -> None:
    headers = _served(target, language, filename, mime)
    assert headers["content-type"] == "application/octet-stream", (filename, mime)
    assert headers["content-disposition"].startswith("attachment;")
    assert headers["x-content-type-options"] == "nosniff"
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "sandbox" in policy


@pytest.mark.parametrize(("filename", "mime", "served"), INERT)
def test_inert_types_keep_their_type(
    target: Target, filename: str, mime: str | None, served: str
) -> None:
    headers = _served(target, "python", filename, mime)
    assert headers["content-type"] == served
    assert headers["content-disposition"].startswith("attachment;")


def test_the_view_runs_its_own_bundle_alone_and_loads_images_from_itself(target: Target) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from toolkiln import web

    app = FastAPI()
    web.mount(app)
    page = TestClient(app).get("/ui")
    policy = dict(
        (d.split()[0], d.partition(" ")[2])
        for d in (p.strip() for p in page.headers["content-security-policy"].split(";"))
    )
    nonce = re.fullmatch(r"'nonce-([A-Za-z0-9_-]+)'", policy["script-src"])
    assert nonce is not None, policy["script-src"]  # not 'self': the origin serves files
    assert re.findall(r"<script[^>]*>", page.text) == [
        f'<script defer nonce="{nonce.group(1)}" src="/ui/assets/app.js">'
    ]
    assert policy["img-src"] == "'self'"  # no image from elsewhere: no tracking pixels
    assert policy["default-src"] == "'none'" and policy["object-src"] == "'none'"
