"""The FastAPI application over a set of services."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

import toolkiln
from toolkiln.api import errors
from toolkiln.api.call_metrics import CallMetrics
from toolkiln.api.middleware import BodyLimit, Metrics, NoNul, Traced
from toolkiln.api.models import ErrorEnvelope
from toolkiln.api.offload import RESERVE, Offload, work_threads
from toolkiln.api.routes import (
    access,
    agents,
    audit,
    builtins,
    generate,
    invoke,
    secrets,
    system,
    tools,
)
from toolkiln.api.runner_metrics import RunnerMetrics
from toolkiln.domain.limits import MAX_BODY_BYTES
from toolkiln.services import tracing
from toolkiln.services.container import Services

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


@asynccontextmanager
async def _no_lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield


def create_app(
    services: Services,
    *,
    metrics_token: str | None = None,
    lifespan: Lifespan = _no_lifespan,
) -> FastAPI:
    error_responses: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorEnvelope}
        for code in (400, 401, 403, 404, 409, 413, 422, 500, 502, 503)
    }
    app = FastAPI(
        title="Toolkiln",
        version=toolkiln.__version__,
        description="Custom AI-agent tools: registry, sandboxed execution, audit.",
        lifespan=lifespan,
        responses=error_responses,
        # No Swagger UI or ReDoc pages: they load script from a CDN into this origin, where the
        # view keeps its token (docs/ui.md); /openapi.json stays.
        docs_url=None,
        redoc_url=None,
    )
    app.openapi = _with_415(app)  # type: ignore[method-assign]
    app.state.services = services
    # Tool calls (invoke, agents' tool calls, built-in calls) on one pool, long work on
    # another (api/offload.py); neither is the thread limiter of FastAPI's sync routes and
    # of the token check, so reads and authentication never wait behind them.
    app.state.offload = Offload(reserve=RESERVE)
    app.state.work = Offload(work_threads(services), "toolkiln-work")
    app.state.metrics_token = metrics_token
    app.state.registry = CollectorRegistry()
    app.state.registry.register(RunnerMetrics(services.system.runners))
    if isinstance(services.observer, CallMetrics):  # the calls' counts (api/call_metrics.py)
        app.state.registry.register(services.observer)
    errors.install(app)
    # invoke and generate before tools: their fixed paths must win over /{tool_id}.
    for module in (system, access, secrets, invoke, generate, tools, audit, builtins, agents):
        app.include_router(module.router)
    # The fast paths of the routes tool calls take, ahead of every router; FastAPI's own
    # routes stay for the document and for any body that is not valid (api/fast.py).
    app.router.routes[:0] = [invoke.fast_invoke(app.router), agents.fast_tool_call(app.router)]
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(NoNul)
    app.add_middleware(Metrics, registry=app.state.registry)
    if tracing.on():  # outermost: the span holds everything the request did
        app.add_middleware(Traced)
    return app


def _with_415(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI's document, plus 415 on every operation that takes a body: BodyLimit answers
    it to a body not sent as JSON, before any route runs (docs/api.md, Conventions)."""
    made = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = made()
            for ops in spec.get("paths", {}).values():
                for op in ops.values():
                    if isinstance(op, dict) and "requestBody" in op:
                        op["responses"].setdefault(
                            "415",
                            {
                                "description": "Unsupported Media Type",
                                "content": {
                                    "application/json": {
                                        "schema": {"$ref": "#/components/schemas/ErrorEnvelope"}
                                    }
                                },
                            },
                        )
            app.openapi_schema = spec
        return app.openapi_schema

    return openapi
