"""The one place that maps errors to HTTP statuses and the contract's error envelope."""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolkiln.domain import errors
from toolkiln.domain.problems import scrub, scrub_all

log = logging.getLogger("toolkiln.api")

STATUS: list[tuple[type[errors.ToolkilnError], int]] = [
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.NotFound, 404),
    (errors.Conflict, 409),
    (errors.PayloadTooLarge, 413),
    (errors.InvalidRequest, 422),
    (errors.TooManyRequests, 429),
    (errors.UpstreamFailed, 502),
    (errors.ServiceUnavailable, 503),
]

# Routes whose body is a tool definition: their body errors are `invalid_tool` problems.
TOOL_DEFINITION_ROUTES = {"create_tool", "update_tool", "test_tool", "validate_tool"}

HTTP_CODES = {
    400: "malformed_json",  # the framework raises 400 only when it cannot parse the body
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def envelope(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    # Details may repeat text from outside (a model's proposal): a lone surrogate in them
    # would make the response fail to encode.
    body = {"error": {"code": code, "message": scrub(message), "details": scrub_all(details)}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def retry_after(exc: errors.ToolkilnError) -> dict[str, str] | None:
    """``Retry-After`` for a refusal that passes: a workspace over its share of long work
    (429), a database outage (503; the service recovers by itself)."""
    if isinstance(exc, errors.TooManyRequests):
        return {"Retry-After": str(max(1, exc.retry_after_s))}
    return {"Retry-After": "1"} if exc.code == "unavailable" else None


def status_of(exc: errors.ToolkilnError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def field_problems(exc_errors: list[Any]) -> list[dict[str, Any]]:
    out = []
    for err in exc_errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        out.append({"field": ".".join(loc) or "body", "message": err.get("msg", "invalid")})
    return out


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str] | None:
    """The methods the OpenAPI document lists for this path (RFC 9110 15.5.6: a 405 carries
    ``Allow``), or None for a path the document does not show.

    Starlette's own header names only the first route that matched, and one path can be
    served by several routes (GET and POST on /v1/workspaces); where a fixed path and a
    template both match (``/v1/custom-tools/runtimes`` and ``.../{tool_id}``), the fixed
    one is the path's.
    """
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    matching = [t for t in paths if _template(t).fullmatch(request.url.path)]
    if not matching:
        return None
    best = min(matching, key=lambda t: (t.count("{"), t))
    return sorted(m.upper() for m in paths[best])


@functools.lru_cache(maxsize=256)
def _template(path: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^}]+\}", path)
    return re.compile("[^/]+".join(re.escape(p) for p in parts))


def install(app: FastAPI) -> None:
    @app.exception_handler(errors.ToolkilnError)
    async def _domain(_: Request, exc: errors.ToolkilnError) -> JSONResponse:
        return envelope(status_of(exc), exc.code, exc.message, exc.details, retry_after(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errs):
            return envelope(400, "malformed_json", "The request body is not valid JSON.")
        problems = field_problems(errs)
        if getattr(request.scope.get("route"), "name", None) in TOOL_DEFINITION_ROUTES:
            n = len(problems)
            message = f"The tool definition has {n} problem{'s' if n != 1 else ''}."
            return envelope(422, "invalid_tool", message, problems)
        return envelope(422, "validation_error", "The request breaks the rules.", problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else "The request failed."
        headers = dict(exc.headers or {})
        allowed = allowed_methods(request) if exc.status_code == 405 else None
        if allowed:
            headers["Allow"] = ", ".join(allowed)
        return envelope(exc.status_code, code, message, headers=headers)

    @app.exception_handler(RecursionError)
    async def _deep(_: Request, _exc: RecursionError) -> JSONResponse:
        return envelope(400, "malformed_json", "The request body is nested too deeply.")

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, _exc: json.JSONDecodeError) -> JSONResponse:
        return envelope(400, "malformed_json", "The request body is not valid JSON.")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return envelope(500, "internal_error", "The service failed; the error was logged.")
