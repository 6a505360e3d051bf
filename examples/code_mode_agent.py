"""Code mode: the model writes one program over the agent's tools instead of calling each one.

The agent's tools come from Toolkiln as a single `run_program` tool (`mode=code`), whose
description declares every tool as a typed signature. The model answers with one program;
Toolkiln runs it in the sandbox, where each `ctx.tools.<name>(...)` call is validated,
counted, audited and held to one budget, and hands back one result. With the OpenAI SDK
(any OpenAI-compatible endpoint) or the Anthropic SDK:

    python examples/code_mode_agent.py --sdk openai --toolkiln http://127.0.0.1:8080 \\
        --token tk_... --agent AGENT_ID --model gpt-4o-mini \\
        --prompt "Email me the three cheapest orders shipped this week"
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import httpx
from anthropic import Anthropic
from openai import OpenAI

MAX_TURNS = 5


def _tools(toolkiln: httpx.Client, agent_id: str, fmt: str, language: str) -> list[Any]:
    params = {"format": fmt, "mode": "code", "language": language}
    return toolkiln.get(f"/v1/agents/{agent_id}/tools", params=params).json()["data"]


def _run(toolkiln: httpx.Client, agent_id: str, call_id: str, arguments: Any) -> str:
    result = toolkiln.post(
        f"/v1/agents/{agent_id}/tool-calls",
        json={"name": "run_program", "arguments": arguments, "tool_call_id": call_id},
    ).json()["data"]
    return str(result["llm"]) if result["status"] == "ok" else json.dumps(result["error"])


def run_openai(
    toolkiln: httpx.Client, agent_id: str, model: OpenAI, model_name: str, prompt: str
) -> str:
    tools = _tools(toolkiln, agent_id, "openai", "python")
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        reply = model.chat.completions.create(model=model_name, messages=messages, tools=tools)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            content = _run(toolkiln, agent_id, call.id, args)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return f"(stopped after {MAX_TURNS} turns)"


def run_anthropic(
    toolkiln: httpx.Client, agent_id: str, model: Anthropic, model_name: str, prompt: str
) -> str:
    tools = _tools(toolkiln, agent_id, "anthropic", "python")
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_TURNS):
        reply = model.messages.create(
            model=model_name, max_tokens=2048, messages=messages, tools=tools
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": u.id,
                "content": _run(toolkiln, agent_id, u.id, u.input),
            }
            for u in uses
        ]
        messages.append({"role": "user", "content": results})
    return f"(stopped after {MAX_TURNS} turns)"


def _key(given: str | None, env: str, base_url: str | None) -> str | None:
    # A local server needs no key, but the SDKs refuse to work without one: a placeholder.
    return given or os.environ.get(env) or ("none" if base_url else None)


def openai_client(base_url: str | None, api_key: str | None) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=_key(api_key, "OPENAI_API_KEY", base_url))


def anthropic_client(base_url: str | None, api_key: str | None) -> Anthropic:
    return Anthropic(base_url=base_url, api_key=_key(api_key, "ANTHROPIC_API_KEY", base_url))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sdk", choices=("openai", "anthropic"), default="openai")
    p.add_argument("--toolkiln", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("TOOLKILN_TOKEN"))
    p.add_argument("--agent", required=True)
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--base-url", default=None)
    p.add_argument(
        "--api-key", help="default OPENAI_API_KEY or ANTHROPIC_API_KEY; a local server needs none"
    )
    p.add_argument("--prompt", required=True)
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.toolkiln, headers=headers, timeout=60) as toolkiln:
        if args.sdk == "openai":
            model = openai_client(args.base_url, args.api_key)
            answer = run_openai(toolkiln, args.agent, model, args.model, args.prompt)
        else:
            claude = anthropic_client(args.base_url, args.api_key)
            answer = run_anthropic(toolkiln, args.agent, claude, args.model, args.prompt)
        print(answer)


if __name__ == "__main__":
    main()
