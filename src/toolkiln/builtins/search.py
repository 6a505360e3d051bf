"""``web_search``: providers behind one interface, chosen by configuration.

- ``searxng``: a self-hosted SearXNG instance's JSON API (``GET {url}/search?format=json``).
- ``brave``: the Brave Search API (``GET {url}/res/v1/web/search``, ``X-Subscription-Token``).
Without a provider the tool answers the error envelope ``not_configured``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec


class SearchProvider(Protocol):
    def search(self, query: str, count: int) -> list[dict[str, str]]: ...


@dataclass(slots=True)
class SearxngProvider:
    base_url: str
    client: httpx.Client

    def search(self, query: str, count: int) -> list[dict[str, str]]:
        r = self.client.get(
            f"{self.base_url.rstrip('/')}/search", params={"q": query, "format": "json"}
        )
        r.raise_for_status()
        items = r.json().get("results", [])
        return [
            {
                "title": str(i.get("title", "")),
                "url": str(i.get("url", "")),
                "snippet": str(i.get("content", "")),
            }
            for i in items[:count]
        ]


@dataclass(slots=True)
class BraveProvider:
    base_url: str
    api_key: str
    client: httpx.Client

    def search(self, query: str, count: int) -> list[dict[str, str]]:
        r = self.client.get(
            f"{self.base_url.rstrip('/')}/res/v1/web/search",
            params={"q": query, "count": count},
            headers={"X-Subscription-Token": self.api_key, "Accept": "application/json"},
        )
        r.raise_for_status()
        items = r.json().get("web", {}).get("results", [])
        return [
            {
                "title": str(i.get("title", "")),
                "url": str(i.get("url", "")),
                "snippet": str(i.get("description", "")),
            }
            for i in items[:count]
        ]


def make_provider(kind: str | None, url: str | None, api_key: str | None) -> SearchProvider | None:
    if not kind:
        return None
    client = httpx.Client(timeout=10, follow_redirects=False)
    if kind == "searxng":
        if not url:
            raise ValueError("TOOLKILN_SEARCH_URL is required for the searxng provider")
        return SearxngProvider(url, client)
    if kind == "brave":
        if not api_key:
            raise ValueError("TOOLKILN_SEARCH_API_KEY is required for the brave provider")
        return BraveProvider(url or "https://api.search.brave.com", api_key, client)
    raise ValueError(f"unknown search provider {kind!r}: use searxng or brave")


class WebSearch:
    spec = BuiltinSpec(
        "web_search",
        "Search the web. Returns {results: [{title, url, snippet}]}.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 400},
                "count": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )

    def __init__(self, provider: SearchProvider | None) -> None:
        self._provider = provider

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        if self._provider is None:
            raise BuiltinFailure(
                "not_configured", "No search provider is configured (TOOLKILN_SEARCH_PROVIDER)."
            )
        call.cost["queries"] = 1
        try:
            results = self._provider.search(payload["query"], int(payload.get("count", 5)))
        except (httpx.HTTPError, ValueError) as exc:
            raise BuiltinFailure(
                "provider_failed", "The search provider did not answer.", {"reason": str(exc)[:300]}
            ) from None
        return {"results": results}
