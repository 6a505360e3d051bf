"""Dependencies shared by the routes: the services and the calling principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolkiln.domain.auth import Principal
from toolkiln.services.container import Services


async def services(request: Request) -> Services:
    # async: FastAPI runs a sync dependency in the thread pool (a hop per request for an
    # attribute read); this one does no I/O.
    svc: Services = request.app.state.services
    return svc


def bearer_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


# Declares the bearer scheme in the OpenAPI document, so generated clients send the token
# (async: no thread-pool hop). The value is checked by the access service, which gives the
# contract's 401 envelope.
bearer_scheme = HTTPBearer(
    auto_error=False, scheme_name="bearer", description="A Toolkiln token: `tk_...`."
)


def principal(
    svc: Annotated[Services, Depends(services)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    return svc.access.authenticate(credentials.credentials.strip() if credentials else None)


Svc = Annotated[Services, Depends(services)]
Caller = Annotated[Principal, Depends(principal)]
