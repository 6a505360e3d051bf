"""``web_search``: providers behind one interface, chosen by configuration.

- ``searxng``: a self-hosted SearXNG instance's JSON API (``GET {url}/search?format=json``).
- ``brave``: the Brave Search API (``GET {url}/res/v1/web/search``, ``X-Subscription-Token``).
Without a provider the tool answers the error envelope ``not_configured``.

A search is over by its deadline as a whole (its own cap, or sooner the caller's), and its
answer is read up to ``SEARCH_MAX_BYTES``: the provider is reached through
``outbound/http.py``'s capped client, so an endpoint that trickles its answer a byte at a time
cannot stretch it and one that sends without end cannot fill the service's memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec
from toolkiln.outbound.cap import TooLarge
from toolkiln.outbound.http import Compressed, capped_client, within

SEARCH_CAP_S = 10.0  # one search, whatever the caller's time
SEARCH_MAX_BYTES = 4 * 1024 * 1024  # one provider's answer, read as it comes


class SearchProvider(Protocol):
    def search(self, query: str, count: int, until: float) -> list[dict[str, str]]: ...


@dataclass(slots=True)
class SearxngProvider:
    base_url: str
    client: httpx.Client

    def search(self, query: str, count: int, until: float) -> list[dict[str, str]]:
        with within(until):
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

    def search(self, query: str, count: int, until: float) -> list[dict[str, str]]:
        with within(until):
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
    client = capped_client(max_bytes=SEARCH_MAX_BYTES, total_s=SEARCH_CAP_S)
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
        until, callers = call.until(SEARCH_CAP_S)
        call.cost["queries"] = 1
        try:
            results = self._provider.search(payload["query"], int(payload.get("count", 5)), until)
        except httpx.TimeoutException as exc:
            if callers and time.monotonic() >= until - 0.05:
                raise call.out_of_time("waiting for the search provider") from None
            raise BuiltinFailure(
                "provider_failed",
                "The search provider did not answer in time.",
                {"reason": f"no answer within {SEARCH_CAP_S:g} s ({type(exc).__name__})"},
            ) from None
        except TooLarge as exc:
            raise BuiltinFailure(
                "provider_failed",
                f"The search provider's answer is over {exc.max_bytes} bytes; it was not read.",
                {"reason": "too_large", "max_bytes": exc.max_bytes},
            ) from None
        except (httpx.HTTPError, ValueError, Compressed) as exc:
            raise BuiltinFailure(
                "provider_failed", "The search provider did not answer.", {"reason": _reason(exc)}
            ) from None
        return {"results": results}


def _reason(exc: Exception) -> str:
    """Why the provider failed, in words that name neither its address nor what its URL
    holds: the exception's text names the whole URL, a password in it included, and goes
    to any workspace's caller (tests/builtins/test_builtins_api.py)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the provider answered HTTP {exc.response.status_code}"
    if isinstance(exc, ValueError):
        return "the provider's answer is not the JSON expected"
    if isinstance(exc, Compressed):
        return "the provider's answer is compressed, though an uncompressed one was asked for"
    return f"the provider could not be reached ({type(exc).__name__})"
