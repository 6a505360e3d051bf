"""AI-assisted creation over HTTP, as JSON or as a server-sent event stream."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from toolkiln.api import models
from toolkiln.api.deps import Svc, Work, Writer
from toolkiln.api.offload import Offload
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import ToolkilnError
from toolkiln.domain.problems import scrub
from toolkiln.services.container import Services
from toolkiln.services.generate import GenerateRequest
from toolkiln.services.places import Place

router = APIRouter(prefix="/v1/custom-tools", tags=["generation"])
log = logging.getLogger("toolkiln.api")

STREAM = "text/event-stream"


class _Gone(Exception):
    """The client of a stream went away: the generation stops at its next step."""


@router.post(
    "/generate",
    response_model=models.One[models.Draft],
    responses={
        200: {"content": {STREAM: {}}, "description": "The draft, or its progress."},
        **models.LONG_WORK,
    },
)
async def generate(
    body: models.GenerateIn, request: Request, who: Writer, svc: Svc, pool: Work
) -> Any:
    """With ``Accept: text/event-stream``: events attempt, validated, example, problems, then
    draft or error. A generation holds a place of its workspace's long work from its first
    question to its end (429 when none is free, before any stream starts); it runs off the
    threads that serve reads (api/offload.py)."""
    wanted = GenerateRequest(body.workspace_id, body.description, body.language, body.name)
    # The refusals (scope, body, configuration, no place) are plain HTTP, stream or not.
    await pool(svc.generate.check, who, wanted)
    # No await from here until a thread owns the place (GenerateService.place).
    place = svc.generate.place(wanted)
    if STREAM not in request.headers.get("accept", ""):
        draft = await _plain(svc, pool, who, wanted, place, request)
        # A client that went away gets no draft (and the response, not sent, no body).
        return {"data": draft} if draft is not None else Response(status_code=204)
    return StreamingResponse(
        _events(svc, who, wanted, place),
        media_type=STREAM,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _plain(
    svc: Services,
    pool: Offload,
    who: Principal,
    wanted: GenerateRequest,
    place: Place,
    request: Request,
) -> dict[str, Any] | None:
    """The generation as one answer, in a thread, stopped at its next step when the client
    goes away (its connection closes: the server says ``http.disconnect``), as a stream is:
    nobody would read the draft, and every further step asks the model again."""
    gone = threading.Event()

    def step(_kind: str, _data: dict[str, Any]) -> None:
        if gone.is_set():
            raise _Gone

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    draft: dict[str, Any] | None = None  # None: the client went away, nobody reads it
    failed: Exception | None = None  # raised outside the task group, as itself
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watch)
        try:
            draft = await pool(svc.generate.generate, who, wanted, step, place)
        except _Gone:
            pass
        except Exception as exc:
            failed = exc
        tasks.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return draft


def _sse(kind: str, data: Any) -> str:
    # Scrubbed as text, after the encoding (the model's data may nest deep; a lone
    # surrogate in it would make the stream fail mid-body).
    return f"event: {kind}\ndata: {scrub(json.dumps(data, ensure_ascii=False))}\n\n"


def _events(
    svc: Services, who: Principal, wanted: GenerateRequest, place: Place
) -> AsyncIterator[str]:
    """The generation runs in a thread of its own, started now, which owns ``place`` and
    gives it back when the generation ends (a stream the server never starts to send would
    otherwise keep it); its events are relayed as they come.

    The wait for the next event is an asyncio wait, so when the client goes away and the
    server cancels the response, ``gone`` is set at once and the generation stops at its
    next step (a wait in a worker thread could not be cancelled: the generation went on
    to ask the model again, to the end)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
    gone = threading.Event()

    def put(item: tuple[str, Any] | None) -> None:
        try:
            loop.call_soon_threadsafe(out.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            gone.set()

    def emit(kind: str, data: dict[str, Any]) -> None:
        if gone.is_set():
            raise _Gone
        put((kind, data))

    def work() -> None:
        try:
            put(("draft", svc.generate.generate(who, wanted, emit, place)))
        except ToolkilnError as exc:
            put(("error", {"code": exc.code, "message": exc.message, "details": exc.details}))
        except _Gone:
            pass
        except Exception:
            log.exception("generation failed")
            put(("error", {"code": "internal_error", "message": "The service failed."}))
        finally:
            put(None)

    threading.Thread(target=work, name="toolkiln-generate", daemon=True).start()
    return _relay(out, gone)


async def _relay(
    out: asyncio.Queue[tuple[str, Any] | None], gone: threading.Event
) -> AsyncIterator[str]:
    try:
        while (item := await out.get()) is not None:
            yield _sse(*item)
    finally:
        gone.set()
