"""The example tools of seed 001 and seed 003, written in Python, give the documented results."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool

CURRENCY = """
def main(**p):
    symbols = {"USD": "$", "EUR": "\\u20ac", "GBP": "\\u00a3"}
    amount = float(p["amount"])
    return {"message": f"{symbols[p['currency']]}{amount:,.2f}"}
"""
SLUG = """
import re
def main(**p):
    slug = re.sub(r"[^a-z0-9]+", "-", p["title"].lower()).strip("-")
    return {"message": slug}
"""
CAGR = """
def main(**p):
    cagr = (p["endValue"] / p["startValue"]) ** (1 / p["years"]) - 1
    return {"message": f"{cagr:.2%}", "rawData": {"cagr": round(cagr, 4), "formatted": f"{cagr:.2%}"}}
"""


def run(
    client: TestClient, space: Space, rw, name: str, code: str, params: dict, payload: dict
) -> dict:
    body = seed_tool(space, name=name, code=code, parameters=params)
    tool = client.post("/v1/custom-tools", json=body, headers=rw).json()["data"]
    r = client.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": payload}, headers=rw)
    return r.json()["data"]


def test_seed_examples(client: TestClient, space: Space, rw) -> None:
    money = {
        "amount": {"type": "number", "required": True},
        "currency": {"type": "string", "required": True},
    }
    assert (
        run(
            client,
            space,
            rw,
            "currency-formatter",
            CURRENCY,
            money,
            {"amount": 1234.5, "currency": "USD"},
        )["message"]
        == "$1,234.50"
    )
    title = {"title": {"type": "string", "required": True}}
    assert (
        run(client, space, rw, "slug-generator", SLUG, title, {"title": "My Blog Post Title"})[
            "message"
        ]
        == "my-blog-post-title"
    )
    growth = {k: {"type": "number", "required": True} for k in ("startValue", "endValue", "years")}
    res = run(
        client,
        space,
        rw,
        "cagr-calculator",
        CAGR,
        growth,
        {"startValue": 100, "endValue": 200, "years": 5},
    )
    assert res["raw_data"] == {"cagr": 0.1487, "formatted": "14.87%"}
    order = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"]
    res = client.post(
        f"/v1/custom-tools/{order['id']}/invoke", json={"input": {"order_id": "42"}}, headers=rw
    ).json()["data"]
    assert res["message"] == "Order 42 is shipped" and res["raw_data"] == {"status": "shipped"}
