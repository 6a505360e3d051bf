"""Code mode's saving, measured: the same task done with direct tool calls and with one program.

Run with `make bench-code-mode`. It builds a Toolkiln of its own (SQLite in a temporary data
dir, every isolation layer on) with an agent of 50 tools, then does the task of
docs/code-mode.md ("email me the three cheapest orders shipped this week") twice, for real,
through the API:

  direct: the calls a model makes one by one (list the orders; three order lookups, sent as
          parallel calls in one turn; the email), each result going back into the context;
  code:   one run_program call whose program does all of it and returns a short summary.

For each it prints the model round trips, and the tokens sent to the model over the whole
conversation: the tool definitions (sent with every request) plus every tool result. Tokens
are estimated as characters / 4 of the JSON the model would receive (no tokenizer can be
downloaded here); the ratio between the two does not depend on that choice. Not part of the
test run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.api.test_code_mode import LIST_ORDERS, ORDER_DETAILS, ORDERS, PY_PROGRAM

from toolkiln.api.app import create_app
from toolkiln.app import build
from toolkiln.config import Settings

TOKEN = "bench-code-mode-admin"
N_TOOLS = 50
PROMPT = "Email me (me@example.org) the three cheapest orders shipped this week."


def tokens(value: Any) -> int:
    return len(value if isinstance(value, str) else json.dumps(value)) // 4


def filler(i: int) -> dict[str, Any]:
    """A tool of typical size: a few typed parameters with descriptions."""
    return {
        "name": f"crm-tool-{i:02d}",
        "description": f"Look up or update record kind {i} in the CRM by id, with optional filters.",
        "parameters": {
            "record_id": {"type": "string", "required": True, "description": "The record id."},
            "fields": {"type": "array", "items": {"type": "string"}, "description": "Fields."},
            "limit": {"type": "integer", "description": "At most this many rows."},
        },
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-code-") as tmp:
        rt = build(Settings(data_dir=Path(tmp)))
        try:
            rt.services.access.bootstrap(TOKEN)
            ws = rt.services.access.authenticate(TOKEN).workspace_id
            h = {"Authorization": f"Bearer {TOKEN}"}
            with TestClient(create_app(rt.services), headers=h) as c:
                run(c, ws)
        finally:
            rt.close()


def run(c: TestClient, ws: str) -> None:
    c.patch(f"/v1/workspaces/{ws}/policy", json={"email_allowlist": ["example.org"]})
    since = {"since": {"type": "string", "required": True, "description": "ISO date"}}
    by_id = {"order_id": {"type": "string", "required": True, "description": "The order id."}}
    made = [
        ("list-orders", LIST_ORDERS, since, "Orders shipped on or after a date."),
        ("order-details", ORDER_DETAILS, by_id, "One order's customer."),
    ]
    for name, code, params, desc in made:
        body = {"workspace_id": ws, "name": name, "language": "python", "code": code}
        body |= {"parameters": params, "description": desc, "enable_globally": True}
        assert c.post("/v1/custom-tools", json=body).status_code == 201
    for i in range(N_TOOLS - 2 - 5):  # 5 built-ins are offered too
        body = {"workspace_id": ws, "language": "python", "code": ORDER_DETAILS, **filler(i)}
        assert c.post("/v1/custom-tools", json={**body, "enable_globally": True}).status_code == 201
    agent = c.post("/v1/agents", json={"workspace_id": ws, "name": "bench"}).json()["data"]
    a = agent["id"]
    direct_defs = c.get(f"/v1/agents/{a}/tools", params={"format": "openai"}).json()["data"]
    code_defs = c.get(f"/v1/agents/{a}/tools", params={"format": "openai", "mode": "code"}).json()[
        "data"
    ]
    names = {d["function"]["description"]: d["function"]["name"] for d in direct_defs}

    def call(name: str, args: Any) -> str:
        r = c.post(f"/v1/agents/{a}/tool-calls", json={"name": name, "arguments": args})
        res = r.json()["data"]
        assert res["status"] == "ok", res
        return json.dumps({"llm": res["llm"], "raw_data": res["raw_data"]})

    # Direct: what the model reads back after each turn.
    listed = call(names["Orders shipped on or after a date."], {"since": ORDERS[0]["shipped"]})
    orders = sorted(json.loads(listed)["raw_data"], key=lambda o: o["total"])[:3]
    details = [call(names["One order's customer."], {"order_id": o["id"]}) for o in orders]
    email = call(
        "send_email",
        {"to": "me@example.org", "subject": "Cheapest", "body_text": "\n".join(details)},
    )
    direct_turns = [[listed], details, [email]]  # tool results added before each next request
    # Code: one program, one result.
    program = call("run_program", {"language": "python", "code": PY_PROGRAM})
    code_turns = [[program]]

    def conversation(defs: Any, turns: list[list[str]], program_tokens: int) -> tuple[int, int]:
        """(requests, tokens sent): every request carries the definitions and all so far."""
        sent, context = 0, tokens(PROMPT) + program_tokens
        for results in turns:
            sent += tokens(defs) + context
            context += sum(tokens(r) for r in results)
        sent += tokens(defs) + context  # the final answer's request
        return len(turns) + 1, sent

    d_req, d_tok = conversation(direct_defs, direct_turns, 0)
    c_req, c_tok = conversation(code_defs, code_turns, tokens(PY_PROGRAM))
    print(f"agent with {len(direct_defs)} tools (custom and built-in)")
    print("| strategy | model requests | tool-definition tokens per request | tokens sent in all |")
    print("|---|---|---|---|")
    print(f"| direct tool calls | {d_req} | {tokens(direct_defs)} | {d_tok} |")
    print(f"| one program (mode=code) | {c_req} | {tokens(code_defs)} | {c_tok} |")
    print(
        f"code mode: {d_req - c_req} fewer round trips, {d_tok / c_tok:.1f}x fewer tokens; "
        f"run_program's description for {len(direct_defs)} tools is ~{tokens(code_defs)} tokens"
    )


if __name__ == "__main__":
    main()
