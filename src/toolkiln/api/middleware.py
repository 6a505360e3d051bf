"""Pure ASGI middleware: the request-body cap, NUL in paths and queries, Prometheus request
metrics and trace spans."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolkiln.api.errors import envelope
from toolkiln.services import tracing


class BodyLimit:
    """Refuse bodies over ``max_bytes`` (413) and bodies that are not JSON (415).

    The body is read here, in full, before the app sees it, whether it comes with a
    ``Content-Length`` or chunked: so an oversized body is always a 413, never a parse error.
    Bodies are capped at ``max_bytes`` (1 MiB), so holding one in memory is bounded.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        kind = content_kind(headers.get(b"content-type", b""))
        has_body = (length.isdigit() and int(length) > 0) or b"transfer-encoding" in headers
        # A body without a Content-Type is refused too (docs/api.md), not judged by its
        # shape.
        if has_body and not is_json(kind):
            response = envelope(
                415,
                "unsupported_media_type",
                "Send the request body as JSON with Content-Type: application/json.",
                {"content_type": kind.decode("latin-1")},
            )
            await response(scope, receive, send)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay_body(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = envelope(
            413,
            "payload_too_large",
            f"The request body is larger than {self.max_bytes} bytes.",
            {"max_bytes": self.max_bytes},
        )
        await response(scope, receive, send)


def content_kind(header: bytes) -> bytes:
    """A Content-Type header's media type, lower-case, without its parameters."""
    return header.split(b";")[0].strip().lower()


def is_json(kind: bytes) -> bool:
    """Whether a media type is JSON (``application/json``, ``application/*+json``): what the
    body cap lets through, and what FastAPI reads as JSON."""
    return kind == b"application/json" or (
        kind.startswith(b"application/") and kind.endswith(b"+json")
    )


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the whole body, already read, in one message, then whatever
    ``receive`` gives (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class NoNul:
    """Refuse a NUL character in the path (404: no id holds one) or in a query parameter
    (422 naming it) before any route runs: PostgreSQL cannot even compare text with NUL,
    so such a value would otherwise become a 500 deep in a lookup."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = None
        if "\x00" in scope.get("path", ""):
            response = envelope(404, "not_found", "No such object (the path holds a NUL).")
        elif b"%00" in scope.get("query_string", b"") or b"\x00" in scope.get("query_string", b""):
            query = scope.get("query_string", b"").decode("latin-1")
            bad = [k for k, v in parse_qsl(query, keep_blank_values=True) if "\x00" in k + v]
            if bad:
                field = bad[0] if "\x00" not in bad[0] else "query"
                response = envelope(
                    422,
                    "validation_error",
                    "A query parameter holds a NUL character.",
                    [{"field": field, "message": "must not contain NUL characters"}],
                )
        if response is None:
            await self.app(scope, receive, send)
        else:
            await response(scope, receive, send)


class Metrics:
    """Request counts and latency histograms per route template, in a registry of our own."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter(
            "toolkiln_http_requests",
            "HTTP requests by route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "toolkiln_http_request_duration_seconds",
            "HTTP request latency by route template.",
            ["method", "route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = _route_of(scope)
            method = scope.get("method", "")
            self.requests.labels(method, route, str(status)).inc()
            self.latency.labels(method, route).observe(time.perf_counter() - start)


def _route_of(scope: MutableMapping[str, Any]) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class Traced:
    """A server span per HTTP request (``{method} {route}``), under the caller's
    ``traceparent`` when it sends one. Installed only when traces are on (``create_app``).
    It records the method, the route's template, the path and the status: never the query,
    a header or a body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", [])
            if k in (b"traceparent", b"tracestate")
        }
        method = scope.get("method", "")
        attributes = {"http.request.method": method, "url.path": scope.get("path", "")}
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with (
            tracing.resumed(tracing.extract(headers)),
            tracing.span(method, attributes, SpanKind.SERVER) as span,
        ):
            try:
                await self.app(scope, receive, recording_send)
            finally:
                route = _route_of(scope)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(StatusCode.ERROR)
