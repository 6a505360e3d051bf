"""Dependencies shared by the routes: the services and the calling principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

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


def principal(request: Request, svc: Annotated[Services, Depends(services)]) -> Principal:
    return svc.access.authenticate(bearer_of(request))


Svc = Annotated[Services, Depends(services)]
Caller = Annotated[Principal, Depends(principal)]
