"""The OpenAI SDK client over real loopback HTTP: failures become llm_unavailable, and only
Toolkiln's settings configure what is sent."""

from __future__ import annotations

import pytest

from tests.model_server import ScriptedModel, propose, text, trickle
from toolkiln.domain.errors import LlmUnavailable
from toolkiln.llm.openai_chat import OpenAIChat

ASK = [{"role": "user", "content": "hi"}]


def test_an_endpoint_that_cannot_be_reached_is_unavailable() -> None:
    with ScriptedModel() as gone:
        url = gone.url
    chat = OpenAIChat(url, "m", None, 5.0)
    with pytest.raises(LlmUnavailable) as caught:
        chat.complete(ASK, [], {})
    assert caught.value.details == {"reason": "connection"}
    assert url not in caught.value.message


def test_ambient_openai_variables_do_not_travel(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "OPENAI_ADMIN_KEY"):
        monkeypatch.setenv(name, f"ambient-{name}")
    with ScriptedModel() as model:
        model.script(propose({"name": "x"}), text("no call"), propose({"n": 1}, as_object=True))
        chat = OpenAIChat(model.url, "m", None, 5.0)
        reply = chat.complete(ASK, [], {})
        assert reply.tool_calls[0].name == "propose_tool"
        assert reply.tool_calls[0].arguments == '{"name": "x"}'
        assert reply.message["tool_calls"][0]["id"] == reply.tool_calls[0].id
        assert (reply.prompt_tokens, reply.completion_tokens) == (1001, 200)
        second = chat.complete(ASK, [], {})
        assert second.tool_calls == [] and second.content == "no call"
        third = chat.complete(ASK, [], {})  # arguments sent as an object still read as JSON
        assert third.tool_calls[0].arguments == '{"n": 1}'
        for sent in model.requests:
            assert "ambient" not in str(sent.headers)
            assert sent.headers["authorization"] == "Bearer none"


def test_an_endpoint_that_trickles_is_cut_off_at_the_timeout() -> None:
    # Each read is answered within half a second, so only a deadline on the whole request
    # (not the SDK's per-read timeout of the same 2 s) can end it.
    with ScriptedModel() as model:
        model.script(trickle())
        chat = OpenAIChat(model.url, "m", None, 2.0)
        with pytest.raises(LlmUnavailable) as caught:
            chat.complete(ASK, [], {})
        assert model.wait_hanging(0)  # the endpoint had started answering
        assert caught.value.details == {"reason": "timeout"}
