"""Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama) through
the official ``openai`` SDK.

The timeout bounds the whole request: the SDK's own timeout applies to connecting and to
each read, so an endpoint that trickles bytes would outlast it; the call therefore runs in a
thread of its own and is abandoned (reported as a timeout) when its time is up.

Only Toolkiln's own settings configure it: the SDK's habit of filling the organisation,
project and admin key from ``OPENAI_*`` environment variables is undone, so nothing the
operator set for another program travels to this endpoint. Errors never quote the
endpoint's answer, its address or the key.
"""

from __future__ import annotations

import json
import threading
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
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                # The SDK types messages as TypedDicts; ours are the same shapes as plain dicts.
                create: Any = self._client.chat.completions.create
                outcome["response"] = create(
                    model=self._model, messages=messages, tools=tools, tool_choice=tool_choice
                )
            except Exception as exc:
                outcome["error"] = exc
            finally:
                done.set()

        # A daemon thread: one abandoned on a trickling endpoint never holds up shutdown.
        threading.Thread(target=call, name="toolkiln-llm", daemon=True).start()
        if not done.wait(self._timeout_s):
            raise LlmUnavailable(
                f"The model endpoint did not answer within {self._timeout_s:g} s.",
                {"reason": "timeout"},
            )
        if "error" in outcome:
            raise self._unavailable(outcome["error"])
        return _reply(outcome["response"])

    def _unavailable(self, exc: Exception) -> LlmUnavailable:
        """What the caller is told: never the endpoint's own words, address or key."""
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
    # What goes back to the model on the next turn, cut: a model endpoint that answered
    # 400 MB of text had it sent back, then twice (until 2026-12-06).
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
