"""Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama) through
the official ``openai`` SDK.

Only Toolkiln's own settings configure it: the SDK's habit of filling the organisation,
project and admin key from ``OPENAI_*`` environment variables is undone, so nothing the
operator set for another program travels to this endpoint. Errors never quote the
endpoint's answer, its address or the key.
"""

from __future__ import annotations

from typing import Any

import openai

from toolkiln.domain.errors import LlmUnavailable
from toolkiln.domain.generation import ChatReply, ToolCall

# Local servers need no key, but the SDK refuses to send a request without one.
NO_KEY = "none"


class OpenAIChat:
    """One client per service; ``max_retries=0`` because a failure is reported, not hidden."""

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float) -> None:
        self._model = model
        self._timeout_s = timeout_s
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or NO_KEY,
            timeout=timeout_s,
            max_retries=0,
        )
        self._client.organization = None
        self._client.project = None
        self._client.admin_api_key = None

    @property
    def model(self) -> str:
        return self._model

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        tool_choice: dict[str, Any],
    ) -> ChatReply:
        try:
            # The SDK types messages as TypedDicts; ours are the same shapes as plain dicts.
            response = self._client.chat.completions.create(  # type: ignore[call-overload]
                model=self._model, messages=messages, tools=tools, tool_choice=tool_choice
            )
        except openai.APITimeoutError as exc:
            raise LlmUnavailable(
                f"The model endpoint did not answer within {self._timeout_s:g} s.",
                {"reason": "timeout"},
            ) from exc
        except openai.APIStatusError as exc:
            raise LlmUnavailable(
                f"The model endpoint answered HTTP {exc.status_code}.",
                {"reason": "status", "status": exc.status_code},
            ) from exc
        except openai.APIConnectionError as exc:
            raise LlmUnavailable(
                "The model endpoint could not be reached.", {"reason": "connection"}
            ) from exc
        except Exception as exc:  # a body that is no chat completion, among others
            raise LlmUnavailable(
                "The model endpoint's answer is not a chat completion.",
                {"reason": "bad_response", "type": type(exc).__name__},
            ) from exc
        return _reply(response)


def _reply(response: Any) -> ChatReply:
    try:
        message = response.choices[0].message
        calls = [
            ToolCall(str(c.id), str(c.function.name), str(c.function.arguments or ""))
            for c in (message.tool_calls or [])
            if getattr(c, "type", "function") == "function"
        ]
        content = message.content if isinstance(message.content, str) else None
    except (AttributeError, IndexError, TypeError) as exc:
        raise LlmUnavailable(
            "The model endpoint's answer has no message.", {"reason": "bad_response"}
        ) from exc
    echo: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        echo["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    usage = getattr(response, "usage", None)
    return ChatReply(
        message=echo,
        tool_calls=calls,
        content=content,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )
