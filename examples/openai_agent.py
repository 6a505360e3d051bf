"""A minimal agent loop with the OpenAI Python SDK, using Toolkiln for its tools.

It fetches the agent's tools from Toolkiln in OpenAI's format, lets the model call them, and
sends every tool call back to Toolkiln's one dispatch endpoint. Works with any
OpenAI-compatible chat-completions endpoint.

    python examples/openai_agent.py --toolkiln http://127.0.0.1:8080 --token tk_... \\
        --agent AGENT_ID --model gpt-4o-mini --prompt "What is 6*7?"
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import httpx
from openai import OpenAI


def run_agent(
    toolkiln: httpx.Client, agent_id: str, model: OpenAI, model_name: str, prompt: str
) -> str:
    tools = toolkiln.get(f"/v1/agents/{agent_id}/tools", params={"format": "openai"}).json()["data"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(10):
        reply = model.chat.completions.create(model=model_name, messages=messages, tools=tools)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = toolkiln.post(
                f"/v1/agents/{agent_id}/tool-calls",
                json={
                    "name": call.function.name,
                    "arguments": json.loads(call.function.arguments or "{}"),
                    "tool_call_id": call.id,
                },
            ).json()["data"]
            # `llm` is what the model should read; a failure explains itself in `error`.
            content = result["llm"] if result["status"] == "ok" else json.dumps(result["error"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(content)})
    return "(stopped after 10 turns)"


KEY_HELP = "default OPENAI_API_KEY; a local server (--base-url) needs none"


def model_client(base_url: str | None, api_key: str | None) -> OpenAI:
    """A local OpenAI-compatible server needs no key, but the SDK refuses to start without
    one: send a placeholder, as Toolkiln's own generation does."""
    return OpenAI(base_url=base_url, api_key=api_key or ("none" if base_url else None))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--toolkiln", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("TOOLKILN_TOKEN"))
    p.add_argument("--agent", required=True)
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help=KEY_HELP)
    p.add_argument("--prompt", required=True)
    args = p.parse_args()
    model = model_client(args.base_url, args.api_key)
    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.toolkiln, headers=headers, timeout=60) as toolkiln:
        print(run_agent(toolkiln, args.agent, model, args.model, args.prompt))


if __name__ == "__main__":
    main()
