"""The Generate wizard against a scripted OpenAI-compatible model on loopback."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.model_server import ScriptedModel, held, propose
from tests.web.conftest import Live, Page, serve
from tests.web.test_hostile import NOTHING_RAN, X

GOOD = (
    "def main(**p):\n"
    "    total = p['a'] + p['b']\n"
    "    return {'message': f'{total}', 'rawData': {'sum': total}}\n"
)
BAD = "def main(**p):\n    total = (p['a'] +\n    return {'message': 'x'}\n"


def proposal(code: str) -> dict:
    number = {"type": "number", "required": True}
    return {
        "name": "add-numbers",
        "description": X,  # what a model writes is hostile as well
        "language": "python",
        "parameters": {"a": number, "b": number},
        "code": code,
        "execution_message_description": "Adding",
        "examples": [{"input": {"a": 2, "b": 3}, "expected": {"raw_data": {"sum": 5}}}],
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, model_server: ScriptedModel) -> Iterator[Live]:
    settings = {"llm_base_url": model_server.url, "llm_model": "scripted"}
    with serve(tmp_path_factory.mktemp("wizard"), **settings) as service:
        yield service


def test_the_wizard_shows_progress_fills_the_form_and_saves_with_the_cases(
    tab: Page, live: Live, model_server: ScriptedModel
) -> None:
    model_server.script(propose(proposal(BAD)), propose(proposal(GOOD)))
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="Generate").click()
    page.get_by_label("Describe the tool").fill("Add two numbers.")
    page.get_by_role("button", name="Generate").click()
    progress = page.locator(".wizard .progress")
    expect(progress).to_contain_text("Draft ready.")
    expect(progress).to_contain_text("Attempt 1 of 3")
    expect(progress).to_contain_text("Attempt 1 had 1 problem")
    expect(progress).to_contain_text("Attempt 2 passed validation")
    expect(progress).to_contain_text("Example 1: ok")
    expect(page.get_by_label("Name")).to_have_value("add-numbers")
    expect(page.get_by_label("Description")).to_have_value(X)
    expect(page.get_by_role("textbox", name="Code")).to_contain_text("total = p['a'] + p['b']")
    expect(page.get_by_label("Test cases")).to_have_value(re.compile('"sum": 5'))
    expect(page.locator(".wizard dl.result")).to_contain_text("Status")
    assert page.evaluate(NOTHING_RAN) == []
    assert len(model_server.requests) == 2

    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Tool: add-numbers")).to_be_visible()
    tool_id = page.url.rsplit("/", 1)[1]
    tool = live.tool(tool_id).json()["data"]
    assert len(tool["test_cases"]) == 1
    assert tool["description"] == X
    assert page.evaluate(NOTHING_RAN) == []


def test_a_generation_that_fails_shows_the_services_message(
    tab: Page, live: Live, model_server: ScriptedModel
) -> None:
    model_server.script(*[propose(proposal(BAD)) for _ in range(3)])
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="Generate").click()
    page.get_by_label("Describe the tool").fill("Add two numbers.")
    page.get_by_role("button", name="Generate").click()
    alert = page.locator(".wizard .form-alert")
    expect(alert).not_to_be_empty()
    expect(page.locator(".wizard .progress")).to_contain_text("Attempt 3 had 1 problem")
    expect(page.get_by_label("Name")).to_have_value("")


def test_generate_runs_one_generation_at_a_time_and_stops_it_when_the_page_is_left(
    tab: Page, live: Live, model_server: ScriptedModel
) -> None:
    page = tab.page
    tab.sign_in()
    page.get_by_role("button", name="Generate").click()
    page.get_by_label("Describe the tool").fill("Add two numbers.")
    generate = page.get_by_role("button", name="Generate")

    # A second press while the model thinks starts no second generation.
    good = {**proposal(GOOD), "name": "add-once"}  # add-numbers may be saved already
    model_server.script(held(propose(good)), propose(good))
    generate.click()
    assert model_server.wait_hanging(10)
    expect(generate).to_be_disabled()
    generate.click(force=True)
    page.wait_for_timeout(500)
    model_server.release()
    expect(page.locator(".wizard .progress")).to_contain_text("Draft ready.")
    expect(generate).to_be_enabled()
    assert len(model_server.requests) == 1

    # Leaving the page while the model thinks stops the generation: nothing more is asked.
    model_server.script(held(propose(proposal(BAD))), propose(good))
    generate.click()
    assert model_server.wait_hanging(10)
    page.get_by_role("link", name="All tools").click()
    expect(page.get_by_role("heading", name="Custom tools")).to_be_visible()
    page.wait_for_timeout(500)
    model_server.release()
    page.wait_for_timeout(1500)
    assert len(model_server.requests) == 1


def test_a_stream_cut_before_its_end_says_so_and_frees_the_button(tab: Page, live: Live) -> None:
    """A stream that ends with neither a draft nor an error (a proxy cut it, the service
    restarted) is reported, not left at "Asking the model…". The cut is made by the browser
    for this one request: the service itself always ends its stream with one or the other."""
    page = tab.page
    tab.sign_in()
    page.route(
        "**/v1/custom-tools/generate",
        lambda route: route.fulfill(
            status=200,
            headers={"content-type": "text/event-stream"},
            body='event: attempt\ndata: {"attempt": 1, "max_attempts": 3}\n\n',
        ),
    )
    page.get_by_role("button", name="Generate").click()
    page.get_by_label("Describe the tool").fill("Add two numbers.")
    generate = page.get_by_role("button", name="Generate")
    generate.click()
    alert = page.locator(".wizard .form-alert")
    expect(alert).to_contain_text("ended before the generation finished")
    expect(page.locator(".wizard .progress")).to_contain_text("Attempt 1 of 3")
    expect(generate).to_be_enabled()
    expect(page.get_by_label("Name")).to_have_value("")
    page.unroute("**/v1/custom-tools/generate")
