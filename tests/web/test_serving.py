"""What /ui sends: the page, its assets, and headers that let only the shipped script run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.conftest import own_service
from toolkiln import web


def client_for(static: Path = web.STATIC) -> TestClient:
    app = FastAPI()
    web.mount(app, static)
    return TestClient(app)


def directives(policy: str) -> dict[str, str]:
    return {d.split()[0]: d.partition(" ")[2] for d in (p.strip() for p in policy.split(";"))}


def test_the_page_has_a_strict_policy_and_fresh_nonces() -> None:
    client = client_for()
    first, second = client.get("/ui"), client.get("/ui")
    assert first.status_code == 200
    assert first.headers["content-type"].startswith("text/html")
    policy = directives(first.headers["content-security-policy"])
    assert policy["default-src"] == "'none'"
    script = re.fullmatch(r"'nonce-([A-Za-z0-9_-]{24})'", policy["script-src"])
    assert script is not None, policy["script-src"]  # the bundle's element alone, not 'self'

    assert policy["frame-ancestors"] == "'none'"
    assert policy["object-src"] == "'none'"
    assert policy["base-uri"] == "'none'"
    assert policy["img-src"] == "'self'"
    for value in policy.values():
        assert "unsafe" not in value
    nonce = re.search(r"'nonce-([^']+)'", policy["style-src"])
    assert nonce is not None
    assert f'content="{nonce.group(1)}"' in first.text
    assert nonce.group(1) != script.group(1)
    assert first.headers["content-security-policy"] != second.headers["content-security-policy"]
    assert first.headers["x-frame-options"] == "DENY"
    assert first.headers["x-content-type-options"] == "nosniff"
    assert first.headers["referrer-policy"] == "no-referrer"
    # The page carries no script of its own: only a reference to the shipped bundle.
    tag = f'<script defer nonce="{script.group(1)}" src="/ui/assets/app.js">'
    assert re.findall(r"<script[^>]*>", first.text) == [tag]


def test_the_root_redirects_to_the_view() -> None:
    res = client_for().get("/", follow_redirects=False)
    assert res.status_code == 307
    assert res.headers["location"] == "/ui"
    assert res.headers["x-content-type-options"] == "nosniff"


def test_assets_are_served_by_name_only() -> None:
    client = client_for()
    js = client.get("/ui/assets/app.js")
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/assets/app.css").headers["content-type"].startswith("text/css")
    for name in ("index.html", "..%2F__init__.py", "app.js.LEGAL.txt", "nope.js"):
        assert client.get(f"/ui/assets/{name}").status_code == 404


def test_an_unbuilt_view_says_how_to_build_it(tmp_path: Path) -> None:
    shutil.copy(web.STATIC / "index.html", tmp_path / "index.html")
    res = client_for(tmp_path).get("/ui")
    assert res.status_code == 503
    assert "make install" in res.text


def test_the_service_serves_no_page_with_outside_script(tmp_path: Path) -> None:
    """The view's origin runs no script it did not ship: no Swagger UI or ReDoc from a CDN."""
    with own_service(tmp_path, "serving-admin-token") as (_, client, _who):
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert client.get(path).status_code == 404, path
        assert client.get("/openapi.json").status_code == 200
