"""``web_search``: providers behind one interface, chosen by configuration.

- ``searxng``: a self-hosted SearXNG instance's JSON API (``GET {url}/search?format=json``).
- ``brave``: the Brave Search API (``GET {url}/res/v1/web/search``, ``X-Subscription-Token``).
Without a provider the tool answers the error envelope ``not_configured``.

A search is over by its deadline as a whole (its own cap, or sooner the caller's): every
connect, read and write of its connection waits at most for the time left, so an endpoint
that trickles its answer a byte at a time cannot stretch it.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import httpcore
import httpx

from toolkiln.builtins import net
from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec

SEARCH_CAP_S = 10.0  # one search, whatever the caller's time

# The deadline (time.monotonic()) of the search running in this thread, if any.
_UNTIL: ContextVar[float | None] = ContextVar("toolkiln_search_until", default=None)


class SearchProvider(Protocol):
    def search(self, query: str, count: int, until: float) -> list[dict[str, str]]: ...


@contextmanager
def _until(until: float) -> Iterator[httpx.Timeout]:
    """Within: this thread's requests end by ``until``; yields the per-request timeout."""
    token = _UNTIL.set(until)
    try:
        yield httpx.Timeout(max(0.001, until - time.monotonic()))
    finally:
        _UNTIL.reset(token)


def _bounded(timeout: float | None, exc: type[httpcore.TimeoutException]) -> float | None:
    until = _UNTIL.get()
    if until is None:
        return timeout
    left = until - time.monotonic()
    if left <= 0:
        raise exc("the search's time ran out")
    return left if timeout is None else min(timeout, left)


class _UntilStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until the running search's
    deadline (httpcore applies a timeout to each read, not to the whole answer)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _UntilStream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _UntilBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        until = time.monotonic() + (SEARCH_CAP_S if bounded is None else bounded)
        try:  # the name's lookup within the time too (builtins/net.py)
            addresses = net.resolve(host, port, until)
        except net.LookupTimeout as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        failure: httpcore.ConnectError | None = None
        for *_, sockaddr in addresses:
            left = max(0.001, until - time.monotonic())
            try:
                stream = self._inner.connect_tcp(
                    str(sockaddr[0]), port, left, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            return _UntilStream(stream)
        raise failure if failure is not None else httpcore.ConnectError(f"{host!r} has no address")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _UntilStream(self._inner.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _client() -> httpx.Client:
    """An httpx client whose connections are ``_UntilStream``s. httpx's transport takes no
    network backend, so its connection pool is made again with one (httpx is pinned, and
    tests/builtins/test_deadline.py fails if this stops holding)."""
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_UntilBackend(),
    )
    return httpx.Client(transport=transport, timeout=SEARCH_CAP_S, follow_redirects=False)


@dataclass(slots=True)
class SearxngProvider:
    base_url: str
    client: httpx.Client

    def search(self, query: str, count: int, until: float) -> list[dict[str, str]]:
        with _until(until) as timeout:
            r = self.client.get(
                f"{self.base_url.rstrip('/')}/search",
                params={"q": query, "format": "json"},
                timeout=timeout,
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
        with _until(until) as timeout:
            r = self.client.get(
                f"{self.base_url.rstrip('/')}/res/v1/web/search",
                params={"q": query, "count": count},
                headers={"X-Subscription-Token": self.api_key, "Accept": "application/json"},
                timeout=timeout,
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
    client = _client()
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
        except (httpx.HTTPError, ValueError) as exc:
            raise BuiltinFailure(
                "provider_failed", "The search provider did not answer.", {"reason": _reason(exc)}
            ) from None
        return {"results": results}


def _reason(exc: Exception) -> str:
    """Why the provider failed, in words that name neither its address nor what its URL
    holds: the exception's text named the whole URL, a password in it included, to any
    workspace's caller (until 2026-12-06; tests/builtins/test_builtins_api.py)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the provider answered HTTP {exc.response.status_code}"
    if isinstance(exc, ValueError):
        return "the provider's answer is not the JSON expected"
    return f"the provider could not be reached ({type(exc).__name__})"
