"""An MCP client (the official ``mcp`` SDK) on an agent's Toolkiln endpoint: list the tools,
then call one.

    python examples/mcp_client.py --url http://127.0.0.1:8080/mcp/agents/AGENT_ID \\
        --token tk_... --call calculate '{"expression": "6*7"}'
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def session_run(url: str, token: str, call: str | None, arguments: dict[str, Any]) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for tool in (await session.list_tools()).tools:
                    print(f"tool {tool.name}: {(tool.description or '').splitlines()[0]}")
                if call is None:
                    return 0
                result = await session.call_tool(call, arguments)
                text = " ".join(c.text for c in result.content if c.type == "text")
                print(f"{'error' if result.is_error else 'result'}: {text}")
                return 1 if result.is_error else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="http://HOST:PORT/mcp/agents/AGENT_ID")
    p.add_argument("--token", required=True, help="a token with read (list) and invoke (call)")
    p.add_argument("--call", help="a tool name from the list")
    p.add_argument("arguments", nargs="?", default="{}", help="the call's arguments, JSON")
    args = p.parse_args()
    return anyio.run(session_run, args.url, args.token, args.call, json.loads(args.arguments))


if __name__ == "__main__":
    raise SystemExit(main())
