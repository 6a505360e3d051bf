"""AI-assisted creation over HTTP (CONTRACT section 9), as JSON or as a server-sent event stream."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from toolkiln.api import models
from toolkiln.api.deps import Svc, Writer
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import ToolkilnError
from toolkiln.services.container import Services
from toolkiln.services.generate import GenerateRequest

router = APIRouter(prefix="/v1/custom-tools", tags=["generation"])
log = logging.getLogger("toolkiln.api")

STREAM = "text/event-stream"


class _Gone(Exception):
    """The client of a stream went away: the generation stops at its next step."""


@router.post(
    "/generate",
    response_model=models.One[models.Draft],
    responses={200: {"content": {STREAM: {}}, "description": "The draft, or its progress."}},
)
def generate(body: models.GenerateIn, request: Request, who: Writer, svc: Svc) -> Any:
    """With ``Accept: text/event-stream``: events attempt, validated, example, problems, then
    draft or error."""
    wanted = GenerateRequest(body.workspace_id, body.description, body.language, body.name)
    if STREAM not in request.headers.get("accept", ""):
        return {"data": svc.generate.generate(who, wanted)}
    svc.generate.check(who, wanted)  # refusals before the stream are plain HTTP errors
    return StreamingResponse(
        _events(svc, who, wanted),
        media_type=STREAM,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _sse(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(svc: Services, who: Principal, wanted: GenerateRequest) -> AsyncIterator[str]:
    """The generation runs in a thread of its own; its events are relayed as they come.

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
            put(("draft", svc.generate.generate(who, wanted, emit)))
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
    try:
        while (item := await out.get()) is not None:
            yield _sse(*item)
    finally:
        gone.set()
