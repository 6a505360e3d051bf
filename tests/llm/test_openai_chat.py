"""The OpenAI SDK client over real loopback HTTP: failures become llm_unavailable, and only
Toolkiln's settings configure what is sent."""

from __future__ import annotations

import pytest

from tests.model_server import ScriptedModel, propose, text
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
        model.script(propose({"name": "x"}), text("no call"))
        chat = OpenAIChat(model.url, "m", None, 5.0)
        reply = chat.complete(ASK, [], {})
        assert reply.tool_calls[0].name == "propose_tool"
        assert reply.tool_calls[0].arguments == '{"name": "x"}'
        assert reply.message["tool_calls"][0]["id"] == reply.tool_calls[0].id
        assert (reply.prompt_tokens, reply.completion_tokens) == (1001, 200)
        second = chat.complete(ASK, [], {})
        assert second.tool_calls == [] and second.content == "no call"
        for sent in model.requests:
            assert "ambient" not in str(sent.headers)
            assert sent.headers["authorization"] == "Bearer none"
