"""Fast paths for the routes every tool call takes: a ``POST`` whose body is valid is served
without FastAPI's request handling (routing through the included routers, dependency solving,
parameter validation, response-model validation); anything else goes to FastAPI's own route,
whose answers (its 401s, 403s and 422s) are the document's
(docs/decisions/111-invoke-route.md, docs/decisions/180-agent-calls-on-the-fast-path.md)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from toolkiln.api.middleware import content_kind, is_json, replay_body

M = TypeVar("M", bound=BaseModel)
# The call: the request, the path's one parameter and the valid body; its response.
Serve = Callable[[Request, str, M], Awaitable[Response]]
_FALLBACK = "toolkiln.fast.fallback"


class FastRoute(Route, Generic[M]):
    """``POST path`` with one path parameter, ``param``: a body that is JSON (declared so) and
    valid for ``model`` (parsed and validated as FastAPI does it: ``json.loads``, then the
    model) is handed to ``serve``; any other body to ``fallback``, the app's router, which
    serves it by FastAPI's route of the same path. Errors of the call reach the app's
    exception handlers as from any route. Mounted ahead of every router by ``create_app``."""

    def __init__(
        self, path: str, name: str, param: str, model: type[M], serve: Serve[M], fallback: ASGIApp
    ) -> None:
        super().__init__(path, _Asgi(self._serve), methods=["POST"], name=name)
        self.include_in_schema = False
        self._param, self._model, self._call, self._fallback = param, model, serve, fallback

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope.get(_FALLBACK):
            return Match.NONE, {}
        match, child = super().matches(scope)
        if match is not Match.NONE:
            # What FastAPI's routes put there, so that /metrics counts this route by its
            # template too (a plain Route does not; it was counted as "unmatched").
            child["route"] = self
        return match, child

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            if not _json_declared(scope):
                raise ValueError("FastAPI reads this body as JSON only when it says it is JSON")
            body = self._model.model_validate(json.loads(raw))
        except (ValueError, RecursionError, ValidationError):  # not JSON, not valid: FastAPI
            scope[_FALLBACK] = True
            await self._fallback(scope, replay_body(raw, receive), send)
            return
        request = Request(scope, receive)
        response = await self._call(request, scope["path_params"][self._param], body)
        await response(scope, receive, send)


def _json_declared(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return is_json(content_kind(value))
    return False  # none: FastAPI's route decides what such a body is


class _Asgi:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)
