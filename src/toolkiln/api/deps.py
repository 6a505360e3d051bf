"""Dependencies shared by the routes: the services and the calling principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from toolkiln.domain.auth import Principal
from toolkiln.services.container import Services


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def principal(request: Request, svc: Annotated[Services, Depends(services)]) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    bearer = value.strip() if scheme.lower() == "bearer" else None
    return svc.access.authenticate(bearer)


Svc = Annotated[Services, Depends(services)]
Caller = Annotated[Principal, Depends(principal)]
