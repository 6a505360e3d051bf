"""A minimal agent loop with the Anthropic Python SDK, using Toolkiln for its tools.

    python examples/anthropic_agent.py --toolkiln http://127.0.0.1:8080 --token tk_... \\
        --agent AGENT_ID --model claude-sonnet-4-5 --prompt "What is 6*7?"
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import httpx
from anthropic import Anthropic


def run_agent(
    toolkiln: httpx.Client, agent_id: str, model: Anthropic, model_name: str, prompt: str
) -> str:
    tools = toolkiln.get(f"/v1/agents/{agent_id}/tools", params={"format": "anthropic"}).json()[
        "data"
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(10):
        reply = model.messages.create(
            model=model_name, max_tokens=1024, messages=messages, tools=tools
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        results = []
        for use in uses:
            result = toolkiln.post(
                f"/v1/agents/{agent_id}/tool-calls",
                json={"name": use.name, "arguments": use.input, "tool_call_id": use.id},
            ).json()["data"]
            ok = result["status"] == "ok"
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": str(result["llm"]) if ok else json.dumps(result["error"]),
                    "is_error": not ok,
                }
            )
        messages.append({"role": "user", "content": results})
    return "(stopped after 10 turns)"


KEY_HELP = "default ANTHROPIC_API_KEY; a local server (--base-url) needs none"


def model_client(base_url: str | None, api_key: str | None) -> Anthropic:
    """A local Anthropic-compatible server needs no key, but the SDK refuses to send a
    request without one: send a placeholder."""
    return Anthropic(base_url=base_url, api_key=api_key or ("none" if base_url else None))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--toolkiln", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("TOOLKILN_TOKEN"))
    p.add_argument("--agent", required=True)
    p.add_argument("--model", default="claude-sonnet-4-5")
    p.add_argument("--base-url", default=os.environ.get("ANTHROPIC_BASE_URL"))
    p.add_argument("--api-key", default=os.environ.get("ANTHROPIC_API_KEY"), help=KEY_HELP)
    p.add_argument("--prompt", required=True)
    args = p.parse_args()
    model = model_client(args.base_url, args.api_key)
    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.toolkiln, headers=headers, timeout=60) as toolkiln:
        print(run_agent(toolkiln, args.agent, model, args.model, args.prompt))


if __name__ == "__main__":
    main()
