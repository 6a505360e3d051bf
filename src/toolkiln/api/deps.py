"""Dependencies shared by the routes: the services and the calling principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolkiln.api.offload import Offload
from toolkiln.domain.auth import Bearer, Principal
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


def call_credential(request: Request, who: Principal | None) -> tuple[Principal | Bearer, str]:
    """Who a tool call is made as, and the key of the turn it takes (services/turns.py): the
    principal a dependency read already, or the request's token, checked by the call's own
    read and keyed by the workspace it was last seen for (the invoke and agent fast paths)."""
    if who is not None:
        return who, who.workspace_id
    credential = Bearer(bearer_of(request))
    return credential, request.app.state.services.invoke.turn_key(credential.value)


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


async def calls(request: Request) -> Offload:
    """The pool tool calls run on (api/offload.py)."""
    pool: Offload = request.app.state.offload
    return pool


async def work(request: Request) -> Offload:
    """The pool of the routes that may start long work (api/offload.py)."""
    pool: Offload = request.app.state.work
    return pool


Svc = Annotated[Services, Depends(services)]
Calls = Annotated[Offload, Depends(calls)]
Work = Annotated[Offload, Depends(work)]
Caller = Annotated[Principal, Depends(principal)]


def _needs(scope: str) -> Callable[[Principal], Awaitable[Principal]]:
    # async: no I/O, no thread-pool hop; FastAPI solves it (and so raises 403) before it
    # judges the body and the query, so a token without the route's scope hears 403, not
    # the body's problems (docs/api.md, "Auth": 401, then 403, then 404 and 422). The
    # services check the scope again; this only makes the answer come first.
    async def needs(who: Caller) -> Principal:
        who.require(scope)
        return who

    needs.__name__ = f"needs_{scope}"
    return needs


Reader = Annotated[Principal, Depends(_needs("read"))]
Writer = Annotated[Principal, Depends(_needs("write"))]
Invoker = Annotated[Principal, Depends(_needs("invoke"))]
Admin = Annotated[Principal, Depends(_needs("admin"))]
