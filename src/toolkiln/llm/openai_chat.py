"""Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama) through
the official ``openai`` SDK.

The SDK sends through Toolkiln's capped client (``outbound/http.py``, given as its
``http_client``): the whole request, its name lookup and every read included, is over by
the timeout (an endpoint that trickles bytes cannot outlast it), and the answer is read
as it comes, up to ``max_answer_bytes``: a larger one is refused (``llm_unavailable``,
reason ``too_large``) when the cap is reached, before it is held whole.

Only Toolkiln's own settings configure it: the SDK's habit of filling the organisation,
project and admin key from ``OPENAI_*`` environment variables is undone, so nothing the
operator set for another program travels to this endpoint (nor do proxy variables: the
capped client reads none). Errors never quote the endpoint's answer, its address or the key.
"""

from __future__ import annotations

import json
from typing import Any, cast

import openai

from toolkiln.domain.errors import LlmUnavailable
from toolkiln.domain.generation import ChatReply, ToolCall
from toolkiln.domain.limits import LLM_ANSWER_BYTES
from toolkiln.outbound.cap import TooLarge
from toolkiln.outbound.http import Compressed, capped_client

# Local servers need no key, but the SDK refuses to send a request without one.
NO_KEY = "none"


class OpenAIChat:
    """One client per service; ``max_retries=0`` because a failure is reported, not hidden."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        timeout_s: float,
        max_answer_bytes: int = LLM_ANSWER_BYTES,
    ) -> None:
        self._model = model
        self._timeout_s = timeout_s
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or NO_KEY,
            timeout=timeout_s,
            max_retries=0,
            # The SDK's own client is httpx2; it takes an httpx.Client as well (it says so
            # when given anything else), and the capped client is httpx's.
            http_client=cast(Any, capped_client(max_bytes=max_answer_bytes, total_s=timeout_s)),
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
            create: Any = self._client.chat.completions.create
            response = create(
                model=self._model, messages=messages, tools=tools, tool_choice=tool_choice
            )
        except Exception as exc:
            raise self._unavailable(exc) from None
        return _reply(response)

    def _unavailable(self, exc: Exception) -> LlmUnavailable:
        """What the caller is told: never the endpoint's own words, address or key."""
        if isinstance(exc, TooLarge):
            return LlmUnavailable(
                f"The model endpoint's answer is over {exc.max_bytes} bytes; it was not read.",
                {"reason": "too_large", "max_bytes": exc.max_bytes},
            )
        if isinstance(exc, openai.APITimeoutError):
            return LlmUnavailable(
                f"The model endpoint did not answer within {self._timeout_s:g} s.",
                {"reason": "timeout"},
            )
        if isinstance(exc, openai.APIStatusError):
            return LlmUnavailable(
                f"The model endpoint answered HTTP {exc.status_code}.",
                {"reason": "status", "status": exc.status_code},
            )
        if isinstance(exc, openai.APIConnectionError):
            return LlmUnavailable(
                "The model endpoint could not be reached.", {"reason": "connection"}
            )
        if isinstance(exc, Compressed):
            return LlmUnavailable(
                "The model endpoint's answer is compressed, though it was asked for none.",
                {"reason": "bad_response", "type": "Compressed"},
            )
        # A body that is no chat completion, among others.
        return LlmUnavailable(
            "The model endpoint's answer is not a chat completion.",
            {"reason": "bad_response", "type": type(exc).__name__},
        )


def _text(arguments: Any) -> str:
    """Arguments are JSON text; some servers send the object itself."""
    if isinstance(arguments, str):
        return arguments
    return "" if arguments is None else json.dumps(arguments)


def _tokens(value: Any) -> int:
    """A usage count as the endpoint gave it; anything that is not a count is none."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return 0
    return int(value)


ECHO_CONTENT_CHARS = 16_000  # of the model's own text, echoed back on the next turn
ECHO_ARGUMENT_CHARS = 256_000  # of a tool call's arguments (a proposal: code and schema)


def _cut(text: str | None, most: int) -> str | None:
    return text if text is None or len(text) <= most else text[:most] + " [cut]"


def _cut_arguments(text: str) -> str:
    """Arguments too long to echo, as JSON still (servers may parse what they get back)."""
    if len(text) <= ECHO_ARGUMENT_CHARS:
        return text
    return json.dumps({"note": f"arguments of {len(text)} characters, not repeated"})


def _reply(response: Any) -> ChatReply:
    # The SDK does not validate the body: any shape may come back, so any failure to read
    # it is a bad response, never an exception that escapes as a 500.
    try:
        message = response.choices[0].message
        calls = [
            ToolCall(str(c.id), str(c.function.name), _text(c.function.arguments))
            for c in (message.tool_calls or [])
            if getattr(c, "type", "function") == "function"
        ]
        content = message.content if isinstance(message.content, str) else None
    except Exception as exc:
        raise LlmUnavailable(
            "The model endpoint's answer has no message.", {"reason": "bad_response"}
        ) from exc
    # What goes back to the model on the next turn, cut: a model endpoint's whole answer,
    # however large, is never sent back to it.
    echo: dict[str, Any] = {"role": "assistant", "content": _cut(content, ECHO_CONTENT_CHARS)}
    if calls:
        echo["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _cut_arguments(c.arguments)},
            }
            for c in calls
        ]
    usage = getattr(response, "usage", None)
    return ChatReply(
        message=echo,
        tool_calls=calls,
        content=content,
        prompt_tokens=_tokens(getattr(usage, "prompt_tokens", 0)),
        completion_tokens=_tokens(getattr(usage, "completion_tokens", 0)),
    )
