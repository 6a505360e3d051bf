"""AI-assisted creation (CONTRACT section 9) over the real HTTP path, against the scripted
OpenAI-compatible server on loopback that the shared runtimes are configured with."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from tests.conftest import LLM_KEY, Space
from tests.model_server import ScriptedModel, fail, hang, held, propose, raw, text
from toolkiln.api.app import create_app
from toolkiln.app import Runtime, build
from toolkiln.config import Settings

CAGR_CODE = {
    "python": (
        "def main(**p):\n"
        "    rate = (p['end_value'] / p['start_value']) ** (1 / p['years']) - 1\n"
        "    return {'message': f'{rate:.2%}', 'rawData': {'cagr': round(rate, 4), 'formatted': f'{rate:.2%}'}}\n"
    ),
    "javascript": (
        "function main(p) {\n"
        "  const rate = Math.pow(p.end_value / p.start_value, 1 / p.years) - 1;\n"
        "  const formatted = (rate * 100).toFixed(2) + '%';\n"
        "  return { message: formatted, rawData: { cagr: Math.round(rate * 10000) / 10000, formatted } };\n"
        "}\n"
    ),
}
BAD_SYNTAX = {
    "python": "def main(**p):\n    rate = (p['end_value'] /\n    return {'message': 'x'}\n",
    "javascript": "function main(p) {\n  const rate = (p.end_value / ;\n  return { message: 'x' };\n}\n",
}
EXPECTED = {"raw_data": {"cagr": 0.1487, "formatted": "14.87%"}}
DESCRIPTION = (
    "Calculate the compound annual growth rate given a start value, end value, and number of years"
)


@pytest.fixture(autouse=True)
def _clean_script(model_server: ScriptedModel) -> Iterator[None]:
    """Steps a test planned but did not use must not answer another test's request."""
    yield
    model_server.script()


def cagr(language: str = "python", **over: object) -> dict:
    number = {"type": "number", "required": True}
    return {
        "name": "cagr-calculator",
        "description": "Compound annual growth rate between two values over some years.",
        "language": language,
        "parameters": {
            "start_value": {**number, "description": "value at the start"},
            "end_value": {**number, "description": "value at the end"},
            "years": {**number, "description": "number of years"},
        },
        "code": CAGR_CODE[language],
        "execution_message_description": "Calculating CAGR",
        "examples": [
            {"input": {"start_value": 100, "end_value": 200, "years": 5}, "expected": EXPECTED}
        ],
        **over,
    }


def generate(client: TestClient, space: Space, rw, language: str = "python", **extra) -> dict:
    body = {"workspace_id": space.id, "description": DESCRIPTION, "language": language, **extra}
    return client.post("/v1/custom-tools/generate", json=body, headers=rw)


def answer_to_first_call(model: ScriptedModel, request_index: int) -> dict:
    """The tool message that answered the previous request's propose_tool call."""
    messages = model.requests[request_index].messages
    assistant = messages[-2]
    tool = messages[-1]
    assert assistant["role"] == "assistant" and tool["role"] == "tool"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    return json.loads(tool["content"])


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_good_first_proposal_becomes_the_draft(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, language: str
) -> None:
    model_server.script(propose(cagr(language)))
    r = generate(client, space, rw, language)
    assert r.status_code == 200, r.text
    draft = r.json()["data"]
    assert draft["name"] == "cagr-calculator" and draft["language"] == language
    assert draft["attempts"] == 1
    assert draft["input_schema"]["required"] == ["start_value", "end_value", "years"]
    (example,) = draft["examples"]
    assert example["result"]["status"] == "ok"
    assert example["result"]["raw_data"] == EXPECTED["raw_data"]
    assert draft["test_cases"] == [
        {
            "name": "example 1",
            "input": {"start_value": 100, "end_value": 200, "years": 5},
            "expect": {"status": "ok", **EXPECTED},
        }
    ]
    assert draft["usage"] == {
        "requests": 1,
        "prompt_tokens": 1001,
        "completion_tokens": 200,
        "sandbox_runs": 1,
    }
    (sent,) = model_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "scripted-model"
    assert [t["function"]["name"] for t in sent.body["tools"]] == ["propose_tool"]
    assert sent.body["tool_choice"] == {"type": "function", "function": {"name": "propose_tool"}}
    runtime = client.get("/v1/custom-tools/runtimes", headers=rw).json()["data"][language]
    system = sent.messages[0]["content"]
    assert all(e["signature"] in system for e in runtime["entrypoints"])
    assert runtime["return_contract"] in system
    assert all(f"{d['name']} {d['version']}" in system for d in runtime["dependencies"])
    assert "calculate" in system and "send_email" in system
    assert DESCRIPTION in sent.messages[1]["content"]
    # Nothing is saved; one audit row says who generated what.
    listed = client.get(f"/v1/custom-tools?workspace_id={space.id}", headers=rw).json()["data"]
    assert listed == []
    rows = client.get(f"/v1/audit?workspace_id={space.id}&event=tool.generated", headers=rw)
    (row,) = rows.json()["data"]
    assert row["data"]["outcome"] == "draft" and row["data"]["name"] == "cagr-calculator"
    assert row["data"]["token_id"] and row["data"]["description"] == DESCRIPTION


def test_the_prompt_offers_only_the_builtins_the_policy_allows(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    r = client.patch(
        f"/v1/workspaces/{space.id}/policy", json={"builtins": ["calculate"]}, headers=rw
    )
    assert r.status_code == 200, r.text
    model_server.script(propose(cagr()))
    assert generate(client, space, rw).status_code == 200
    system = model_server.requests[0].messages[0]["content"]
    assert "- calculate:" in system and "send_email" not in system and "web_search" not in system


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_syntax_error_goes_back_with_its_line_and_the_fix_is_the_draft(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, language: str
) -> None:
    model_server.script(propose(cagr(language, code=BAD_SYNTAX[language])), propose(cagr(language)))
    r = generate(client, space, rw, language)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["attempts"] == 2
    assert len(model_server.requests) == 2
    answer = answer_to_first_call(model_server, 1)
    assert answer["accepted"] is False and answer["attempts_left"] == 2
    (code_problem,) = [p for p in answer["problems"] if p["field"] == "code"]
    assert code_problem["line"] == 2
    assert "- code (line 2, column " in answer["summary"]  # and as text, for any reader
    # The conversation went on: system, user, the first proposal, its answer.
    roles = [m["role"] for m in model_server.requests[1].messages]
    assert roles == ["system", "user", "assistant", "tool"]


def test_an_example_that_misses_its_expected_goes_back(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    wrong = cagr(
        examples=[
            {
                "input": {"start_value": 100, "end_value": 200, "years": 5},
                "expected": {"raw_data": {"cagr": 0.2, "formatted": "20.00%"}},
            }
        ]
    )
    model_server.script(propose(wrong), propose(cagr()))
    r = generate(client, space, rw)
    assert r.status_code == 200 and r.json()["data"]["attempts"] == 2
    answer = answer_to_first_call(model_server, 1)
    (p,) = answer["problems"]
    assert p["field"] == "examples.0.expected.raw_data"
    assert "0.1487" in p["message"] and "0.2" in p["message"]


@pytest.mark.parametrize(
    ("expected", "expect"),
    [
        ({"cagr": 0.1487, "formatted": "14.87%"}, {"raw_data": EXPECTED["raw_data"]}),
        ("14.87%", {"message": "14.87%"}),
        ({"status": "ok", "message": "14.87%"}, {"message": "14.87%"}),
    ],
)
def test_expected_may_be_the_value_itself_or_a_partial_result(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, expected, expect
) -> None:
    example = {"input": {"start_value": 100, "end_value": 200, "years": 5}, "expected": expected}
    wrong = {**example, "expected": {"cagr": 0.5}}
    model_server.script(propose(cagr(examples=[wrong])), propose(cagr(examples=[example])))
    r = generate(client, space, rw)
    assert r.status_code == 200, r.text
    draft = r.json()["data"]
    assert draft["examples"][0]["expected"] == expected
    assert draft["test_cases"][0]["expect"] == {"status": "ok", **expect}
    (p,) = answer_to_first_call(model_server, 1)["problems"]
    assert p["field"] == "examples.0.expected.raw_data"


def test_an_example_without_expected_runs_and_its_result_becomes_the_test_case(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    loose = cagr(examples=[{"input": {"start_value": 100, "end_value": 121, "years": 2}}])
    model_server.script(propose(loose))
    r = generate(client, space, rw)
    assert r.status_code == 200, r.text
    (case,) = r.json()["data"]["test_cases"]
    assert case["expect"] == {"status": "ok", "raw_data": {"cagr": 0.1, "formatted": "10.00%"}}


DEEP_RESULT = (
    "def main(**p):\n"
    "    v = 1\n"
    "    for _ in range(45):\n"
    "        v = {'a': v}\n"
    "    return {'message': 'deep', 'rawData': v}\n"
)
BIG_RESULT = "def main(**p):\n    return {'message': 'big', 'rawData': {'s': 'x' * 300000}}\n"


def save_draft(client: TestClient, space: Space, rw, draft: dict):
    keys = ("name", "description", "language", "parameters", "code", "test_cases")
    body = {"workspace_id": space.id, **{k: draft[k] for k in keys}}
    body["execution_message_description"] = draft["execution_message_description"]
    return client.post("/v1/custom-tools", json=body, headers=rw)


@pytest.mark.parametrize(
    ("code", "examples", "field"),
    [
        # The run's raw_data nests 45 deep: a test case expecting it is too deep to store.
        (DEEP_RESULT, [{"input": {}}], "examples.0"),
        # 4 results of 300 KB: as test cases, a create body over the 1 MiB limit.
        (BIG_RESULT, [{"input": {"n": i}} for i in range(4)], "examples"),
    ],
    ids=["too-deep", "too-big"],
)
def test_a_draft_whose_test_cases_a_create_would_refuse_goes_back_to_the_model(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, code, examples, field
) -> None:
    unsaveable = cagr(code=code, parameters={}, examples=examples)
    model_server.script(propose(unsaveable), propose(cagr()))
    r = generate(client, space, rw)
    assert r.status_code == 200, r.text
    draft = r.json()["data"]
    assert draft["attempts"] == 2
    answer = answer_to_first_call(model_server, 1)
    assert [p["field"] for p in answer["problems"]] == [field], answer
    # What is handed over saves as it is.
    saved = save_draft(client, space, rw, draft)
    assert saved.status_code == 201, saved.text


def test_an_example_that_fails_sends_back_the_error_and_its_line(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    crashing = (
        "def main(**p):\n    years = p['years']\n    return {'message': str(1 / (years - years))}\n"
    )
    model_server.script(propose(cagr(code=crashing)), propose(cagr()))
    assert generate(client, space, rw).status_code == 200
    (p,) = answer_to_first_call(model_server, 1)["problems"]
    assert p["field"] == "examples.0" and p["line"] == 3
    assert "ZeroDivisionError" in p["message"]


def test_malformed_arguments_are_a_problem_to_report(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script(propose('{"name": "cagr-calculator", "code": '), propose(cagr()))
    r = generate(client, space, rw)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["attempts"] == 2
    (p,) = answer_to_first_call(model_server, 1)["problems"]
    assert p["field"] == "arguments" and "not valid JSON" in p["message"]
    assert p["line"] == 1 and p["column"] > 1


def test_every_tool_call_and_a_reply_without_one_are_answered(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script(
        text("Here is a tool: def main(): ..."),
        propose(cagr(name="Bad Name"), "something_else"),
        propose(cagr()),
    )
    assert generate(client, space, rw).status_code == 200
    second = model_server.requests[1].messages
    assert second[-1]["role"] == "user" and "propose_tool" in second[-1]["content"]
    third = model_server.requests[2].messages
    answered = [m["tool_call_id"] for m in third if m["role"] == "tool"]
    assert answered == [c["id"] for c in third[-3]["tool_calls"]]
    assert "name" in {p["field"] for p in json.loads(third[-2]["content"])["problems"]}


def test_a_huge_answer_goes_back_to_the_model_cut(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    """A model endpoint that answered 400 MB of text had it sent back on the next turn, and
    twice on the one after (until 2026-12-06): what is echoed is cut."""
    model_server.script(text("x" * 2_000_000), propose(cagr()))
    assert generate(client, space, rw).status_code == 200
    echoed = model_server.requests[1].messages[-2]
    assert echoed["role"] == "assistant" and echoed["content"].endswith(" [cut]")
    assert len(echoed["content"]) < 20_000
    assert len(json.dumps(model_server.requests[1].messages)) < 100_000


def test_three_bad_proposals_fail_with_the_last_problems(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    bad = [propose(cagr(code=BAD_SYNTAX["python"])) for _ in range(2)]
    model_server.script(*bad, propose(cagr(name="Still_Bad")))
    r = generate(client, space, rw)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "generation_failed"
    assert [p["field"] for p in err["details"]] == ["name"]
    assert len(model_server.requests) == 3
    listed = client.get(f"/v1/custom-tools?workspace_id={space.id}", headers=rw).json()["data"]
    assert listed == []
    rows = client.get(f"/v1/audit?workspace_id={space.id}&event=tool.generated", headers=rw)
    (row,) = rows.json()["data"]
    assert row["data"]["outcome"] == "generation_failed" and row["data"]["attempts"] == 3


def test_unstorable_text_in_a_proposal_is_a_problem_never_a_500(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    """A model's expected value with a lone surrogate made the failure's details fail to
    encode (a 500; streamed, a cut stream), and a name with NUL failed the audit row's
    write on PostgreSQL (until 2026-12-06)."""
    example = {"input": {"start_value": 1, "end_value": 2, "years": 1}}
    lone = [{**example, "expected": {"message": "\ud800"}}]
    for bad in (cagr(examples=lone), cagr(name="a\x00")):
        model_server.script(*[propose(json.dumps(bad)) for _ in range(3)])
        r = generate(client, space, rw)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "generation_failed", r.text
        model_server.script(*[propose(json.dumps(bad)) for _ in range(3)])
        body = {"workspace_id": space.id, "description": DESCRIPTION}
        headers = {**rw, "Accept": "text/event-stream"}
        with client.stream("POST", "/v1/custom-tools/generate", json=body, headers=headers) as s:
            events = events_of(s)
        assert events[-1][0] == "error", events[-1]
        assert events[-1][1]["code"] == "generation_failed", events[-1]
    rows = client.get(f"/v1/audit?workspace_id={space.id}&event=tool.generated", headers=rw)
    assert len(rows.json()["data"]) == 4, rows.text


@pytest.mark.parametrize("status", [500, 401])
def test_a_failing_endpoint_is_llm_unavailable(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, status: int
) -> None:
    model_server.script(fail(status), propose(cagr()))
    r = generate(client, space, rw)
    assert r.status_code == 502, r.text
    err = r.json()["error"]
    assert err["code"] == "llm_unavailable" and err["details"]["status"] == status
    assert "scripted failure" not in r.text  # the endpoint's words are not passed on
    assert len(model_server.requests) == 1  # no retry behind the user's back


def _completion_with(message: object = None, usage: object = None, choices: object = None) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "propose_tool", "arguments": "{}"}}
    if message is None:
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
    body: dict = {"id": "x", "object": "chat.completion", "model": "m"}
    body["choices"] = [{"index": 0, "message": message}] if choices is None else choices
    if usage is not None:
        body["usage"] = usage
    return body


NO_COMPLETION = {
    "choices-object": _completion_with(choices={"0": {"message": {}}}),
    "choices-text": _completion_with(choices="none"),
    "choice-list": _completion_with(choices=[[1]]),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("body", NO_COMPLETION.values(), ids=NO_COMPLETION.keys())
def test_an_answer_that_is_no_chat_completion_is_llm_unavailable_never_a_500(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, body: dict, stream: bool
) -> None:
    model_server.script(raw(body), propose(cagr()))
    if not stream:
        r = generate(client, space, rw)
        assert r.status_code == 502, r.text
        err = r.json()["error"]
    else:
        headers = {**rw, "Accept": "text/event-stream"}
        payload = {"workspace_id": space.id, "description": DESCRIPTION}
        with client.stream("POST", "/v1/custom-tools/generate", json=payload, headers=headers) as r:
            events = events_of(r)
        assert [k for k, _ in events] == ["attempt", "error"]
        err = events[-1][1]
    assert err["code"] == "llm_unavailable", err
    assert err["details"]["reason"] == "bad_response"
    assert len(model_server.requests) == 1


GARBLED_USAGE = {
    "text": {"prompt_tokens": "lots", "completion_tokens": 7},
    "lists": {"prompt_tokens": [1], "completion_tokens": {}},
    # 1e308 * 10 is inf: json.dumps writes Infinity, which the SDK reads back as a float.
    "infinite": {"prompt_tokens": 1e308 * 10, "completion_tokens": -5},
}


@pytest.mark.parametrize("usage", GARBLED_USAGE.values(), ids=GARBLED_USAGE.keys())
def test_a_garbled_usage_counts_nothing_and_the_proposal_is_still_read(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, usage: dict
) -> None:
    model_server.script(raw(_completion_with(usage=usage)), propose(cagr()))
    r = generate(client, space, rw)
    assert r.status_code == 200, r.text
    draft = r.json()["data"]
    assert draft["attempts"] == 2  # the first proposal ({}) was read and answered
    good = 7 if usage["completion_tokens"] == 7 else 0
    assert draft["usage"]["prompt_tokens"] == 1002  # only the scripted second answer's
    assert draft["usage"]["completion_tokens"] == 200 + good


def test_an_endpoint_that_hangs_is_llm_unavailable_after_its_timeout(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script(hang())
    try:
        r = generate(client, space, rw)
    finally:
        model_server.release()
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "llm_unavailable"
    assert r.json()["error"]["details"] == {"reason": "timeout"}


def test_without_a_model_it_is_llm_not_configured(tmp_path: Path) -> None:
    rt = build(Settings(data_dir=tmp_path), sandbox=False)
    try:
        rt.services.access.bootstrap("admin-token-none")
        auth = {"Authorization": "Bearer admin-token-none"}
        client = TestClient(create_app(rt.services))
        ws = client.get("/v1/workspaces", headers=auth).json()["data"][0]["id"]
        body = {"workspace_id": ws, "description": DESCRIPTION}
        r = client.post("/v1/custom-tools/generate", json=body, headers=auth)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "llm_not_configured"
    finally:
        rt.close()


def test_the_request_is_checked_before_the_model_is_asked(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script()
    body = {"workspace_id": space.id, "description": DESCRIPTION}
    url = "/v1/custom-tools/generate"
    assert client.post(url, json=body, headers=space.auth("read")).status_code == 403
    assert client.post(url, json={**body, "description": ""}, headers=rw).status_code == 422
    assert client.post(url, json={**body, "name": "Bad Name"}, headers=rw).status_code == 422
    assert client.post(url, json={**body, "language": "cobol"}, headers=rw).status_code == 422
    other = {**body, "workspace_id": "nope"}
    assert client.post(url, json=other, headers=rw).status_code == 404
    made = client.post(
        "/v1/custom-tools",
        json={
            "workspace_id": space.id,
            "name": "taken",
            "language": "python",
            "code": "def main(**p):\n    return {'message': 'x'}\n",
        },
        headers=rw,
    )
    assert made.status_code == 201
    r = client.post(url, json={**body, "name": "taken"}, headers=rw)
    assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"
    assert model_server.requests == []


def events_of(response) -> list[tuple[str, dict]]:
    out, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((kind, json.loads(line.removeprefix("data: "))))
    return out


def test_progress_streams_as_server_sent_events(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script(propose(cagr(code=BAD_SYNTAX["python"])), propose(cagr()))
    body = {"workspace_id": space.id, "description": DESCRIPTION}
    headers = {**rw, "Accept": "text/event-stream"}
    with client.stream("POST", "/v1/custom-tools/generate", json=body, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = events_of(r)
    kinds = [k for k, _ in events]
    assert kinds == ["attempt", "problems", "attempt", "validated", "example", "draft"]
    assert events[1][1]["problems"][0]["line"] == 2
    assert events[4][1]["passed"] is True and events[4][1]["result"]["status"] == "ok"
    assert events[-1][1]["attempts"] == 2 and events[-1][1]["name"] == "cagr-calculator"


def test_a_stream_that_fails_ends_with_an_error_event(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    model_server.script(fail(503))
    body = {"workspace_id": space.id, "description": DESCRIPTION}
    headers = {**rw, "Accept": "text/event-stream"}
    with client.stream("POST", "/v1/custom-tools/generate", json=body, headers=headers) as r:
        events = events_of(r)
    assert [k for k, _ in events] == ["attempt", "error"]
    assert events[-1][1]["code"] == "llm_unavailable"
    # Refusals before the model is asked stay plain HTTP errors.
    r = client.post("/v1/custom-tools/generate", json={**body, "description": ""}, headers=headers)
    assert r.status_code == 422


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "one-answer"])
def test_a_generation_whose_client_goes_away_stops_at_its_next_step(
    runtime: Runtime,
    client: TestClient,
    space: Space,
    rw,
    model_server: ScriptedModel,
    streamed: bool,
) -> None:
    # A real server (uvicorn on loopback), since what matters is a real connection closing.
    server = uvicorn.Server(
        uvicorn.Config(create_app(runtime.services), port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        model_server.script(held(propose(cagr(code=BAD_SYNTAX["python"]))), propose(cagr()))
        body = {"workspace_id": space.id, "description": DESCRIPTION}
        headers = {**rw, "Accept": "text/event-stream"} if streamed else rw
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            if streamed:
                url = "/v1/custom-tools/generate"
                with http.stream("POST", url, json=body, headers=headers) as r:
                    assert next(r.iter_lines()) == "event: attempt"
                    assert model_server.wait_hanging(10)
            else:  # one answer: the client gives up waiting for it
                with pytest.raises(httpx.ReadTimeout):
                    http.post("/v1/custom-tools/generate", json=body, headers=headers, timeout=2)
                assert model_server.wait_hanging(10)
        # The client is gone while the model thinks; its answer is the last step taken.
        time.sleep(0.5)
        model_server.release()
        deadline = time.monotonic() + 10
        outcome = None
        while outcome is None and time.monotonic() < deadline:
            url = f"/v1/audit?workspace_id={space.id}&event=tool.generated"
            rows = client.get(url, headers=rw).json()["data"]
            outcome = rows[0]["data"]["outcome"] if rows else None
            time.sleep(0.1)
        assert outcome == "interrupted"
        time.sleep(0.5)
        assert len(model_server.requests) == 1  # it did not ask the model again
    finally:
        model_server.release()
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_the_draft_saves_invokes_and_its_test_cases_refuse_a_bad_edit(
    client: TestClient, space: Space, rw, model_server: ScriptedModel, language: str
) -> None:
    model_server.script(propose(cagr(language)))
    draft = generate(client, space, rw, language).json()["data"]
    create = {
        "workspace_id": space.id,
        **{
            k: draft[k]
            for k in (
                "name",
                "description",
                "language",
                "parameters",
                "code",
                "execution_message_description",
                "test_cases",
            )
        },
    }
    r = client.post("/v1/custom-tools", json=create, headers=rw)
    assert r.status_code == 201, r.text
    tool = r.json()["data"]
    assert tool["test_cases"] == draft["test_cases"]
    result = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke",
        json={"input": {"start_value": 50, "end_value": 100, "years": 5}},
        headers=rw,
    ).json()["data"]
    assert result["status"] == "ok" and result["raw_data"]["formatted"] == "14.87%"
    if language == "python":
        off_by_one = draft["code"].replace("(1 / p['years'])", "(1 / (p['years'] + 1))")
    else:
        off_by_one = draft["code"].replace("1 / p.years", "1 / (p.years + 1)")
    assert off_by_one != draft["code"]
    r = client.patch(f"/v1/custom-tools/{tool['id']}", json={"code": off_by_one}, headers=rw)
    assert r.status_code == 422 and r.json()["error"]["code"] == "tests_failed"
    (case,) = r.json()["error"]["details"]
    assert case["name"] == "example 1" and case["mismatch"][0]["field"] == "raw_data"
    assert client.get(f"/v1/custom-tools/{tool['id']}", headers=rw).json()["data"]["version"] == 1


def test_secrets_reach_neither_the_model_nor_the_audit_nor_the_log(
    client: TestClient,
    space: Space,
    rw,
    model_server: ScriptedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    model_server.script(propose(cagr(code=BAD_SYNTAX["python"])), propose(cagr()))
    assert generate(client, space, rw).status_code == 200
    bearer = rw["Authorization"].removeprefix("Bearer ")
    for sent in model_server.requests:
        body = json.dumps(sent.body)
        assert LLM_KEY not in body and bearer not in body
        assert sent.headers["authorization"] == f"Bearer {LLM_KEY}"  # the endpoint's own auth
        assert not any(k.lower().startswith("openai-") for k in sent.headers)
    audit = client.get(f"/v1/audit?workspace_id={space.id}", headers=rw).text
    assert LLM_KEY not in audit and bearer not in audit
    assert LLM_KEY not in caplog.text and bearer not in caplog.text


def test_a_proposed_egress_is_in_the_draft_and_its_examples_reach_no_host(
    client: TestClient, space: Space, rw, model_server: ScriptedModel
) -> None:
    from tests.egress.servers import server

    with server() as api:
        code = (
            "def main(*, ctx, **p):\n"
            f"    got = ctx.tools.http_request({{'method': 'GET', 'url': '{api.url('/json')}'}})\n"
            "    return {'message': 'asked', 'rawData': {'error': got.get('error')}}\n"
        )
        proposal = cagr(
            code=code,
            parameters={},
            egress=[f"127.0.0.1:{api.port}"],
            examples=[{"input": {}, "expected": {"raw_data": {"error": "dry_run"}}}],
        )
        client.patch(
            f"/v1/workspaces/{space.id}/policy",
            json={"egress_private": True},
            headers=space.auth("admin"),
        )
        model_server.script(propose(proposal))
        r = generate(client, space, rw)
        assert r.status_code == 200, r.text
        assert r.json()["data"]["egress"] == [f"127.0.0.1:{api.port}"]
        assert api.seen.connections == 0
