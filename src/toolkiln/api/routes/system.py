"""Health, metrics and other unauthenticated endpoints."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toolkiln.api.deps import Svc
from toolkiln.domain.errors import Unauthenticated

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz(svc: Svc) -> JSONResponse:
    ready, body = svc.system.health()
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    required = request.app.state.metrics_token
    if required:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), required.encode()):
            raise Unauthenticated("This endpoint needs the metrics token.")
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
