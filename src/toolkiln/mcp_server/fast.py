"""A ``tools/call`` on an initialized streamable HTTP session, answered by the session's
transport itself instead of through the SDK's session machinery (its message streams, the
dispatcher's task per request, sse-starlette's task group per answer): the same call
(``ToolCalls``), the same checks, the same result, error and span, one event on the wire
(docs/decisions/181-mcp-calls-answered-by-the-transport.md).

Only a request the SDK would serve as the plain case is taken: a POST the transport accepts
(its DNS-rebinding check, session id and idle clock are the SDK's, run before this), that
accepts an event stream, is declared JSON and parses as one JSON-RPC ``tools/call`` request
whose params the SDK's own models find valid, on a session whose ``initialize`` was
accepted, with no ``progressToken`` (the status line is sent as progress while the run
starts: the SDK's path does that). Anything else goes on to the SDK, which answers it as it
always did. tests/mcp/test_fast_calls.py sends both paths the same requests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import mcp.types as types
import pydantic_core
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import (
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp_types import (
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from mcp_types import methods as spec
from pydantic import ValidationError
from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from toolkiln.mcp_server.server import Endpoint, ToolCalls, failed_in
from toolkiln.services import tracing

log = logging.getLogger("toolkiln.mcp")

METHOD = "tools/call"
_TRANSPORT = "toolkiln.mcp.transport"  # where a POST's scope names the session's transport
# The answer's headers, as the SDK's event stream has them (tests/mcp/test_fast_calls.py).
_HEADERS = {
    "Cache-Control": "no-cache, no-transform",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
    "Content-Type": "text/event-stream; charset=utf-8",
}

# Who calls and how, from the HTTP request the endpoint authenticated.
EndpointOf = Callable[[Request], Endpoint]


@dataclass(frozen=True, slots=True)
class _Call:
    id: str | int
    params: dict[str, Any]
    typed: types.CallToolRequestParams
    version: str


class Sessions:
    """The server's outermost middleware on streamable HTTP: each message a session's
    runner receives over a POST tells that session's transport who its peer is (the SDK's
    ``ServerSession``, whose connection knows whether ``initialize`` was accepted and the
    protocol version agreed), so that the transport can answer a ``tools/call`` itself."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        request = ctx.request
        if isinstance(request, Request):
            transport = request.scope.get(_TRANSPORT)
            if isinstance(transport, Transport):
                transport.peer = ctx.session
        return await call_next(ctx)


class Transport(StreamableHTTPServerTransport):
    """The SDK's transport for one session, but a plain ``tools/call`` (above) is answered
    here: ``calls`` runs it, ``endpoint`` tells who calls."""

    peer: ServerSession | None = None

    def __init__(self, manager: SessionManager, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._manager = manager

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        scope[_TRANSPORT] = self
        call = await self._plain_call(request)
        if call is None:  # the SDK's, which reads the body kept by request.body()
            await super()._handle_post_request(scope, request, receive, send)
            return
        self._manager.answered += 1
        answer = await self._answer(request, call)
        data = answer.model_dump_json(by_alias=True, exclude_unset=True)
        headers = {**_HEADERS, MCP_SESSION_ID_HEADER: self.mcp_session_id or ""}
        await Response(ServerSentEvent(data, event="message").encode(), headers=headers)(
            scope, receive, send
        )

    async def _plain_call(self, request: Request) -> _Call | None:
        """The request as a call this transport answers itself; None for the SDK."""
        peer = self.peer
        if peer is None or peer.client_params is None:  # not initialized (or not seen so)
            return None
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse and self._check_content_type(request)):
            return None
        if request.headers.get(MCP_SESSION_ID_HEADER) != self.mcp_session_id:
            return None
        try:
            message = jsonrpc_message_adapter.validate_python(
                pydantic_core.from_json(await request.body()), by_name=False
            )
        except ValueError:  # not JSON, not JSON-RPC (pydantic's ValidationError is one)
            return None
        if not isinstance(message, JSONRPCRequest) or message.method != METHOD:
            return None
        params = message.params
        if not isinstance(params, dict) or progress_token_from_params(params) is not None:
            return None
        version = peer.protocol_version
        try:
            spec.validate_client_request(METHOD, version, params)
            typed = types.CallToolRequestParams.model_validate(params, by_name=False)
        except (KeyError, ValidationError):
            return None
        return _Call(message.id, params, typed, version)

    async def _answer(self, request: Request, call: _Call) -> JSONRPCResponse | JSONRPCError:
        """What the SDK's runner and dispatcher answer for this request, in one span."""
        meta = call.params.get("_meta")
        with tracing.mcp_message(
            METHOD,
            call.params,
            meta if isinstance(meta, Mapping) else None,
            request_id=call.id,
            protocol_version=call.version,
            session_id=self.mcp_session_id,
            transport="tcp",
        ) as span:
            try:
                at = self._manager.endpoint(request)
                result = await self._manager.calls(at, call.typed.name, call.typed.arguments or {})
                dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                dumped = spec.serialize_server_result(METHOD, call.version, dumped)
            except Exception as exc:
                failed_in(span, exc)
                return JSONRPCError(jsonrpc="2.0", id=call.id, error=_error_of(exc))
            if dumped.get("isError"):
                tracing.mcp_answered(span, "tool_error")
            return JSONRPCResponse(jsonrpc="2.0", id=call.id, result=dumped)


def _error_of(exc: Exception) -> ErrorData:
    """The SDK dispatcher's mapping of a handler's exception (``JSONRPCDispatcher``): its
    own error, INVALID_PARAMS for a ValidationError, else code 0 with the message."""
    error = handler_exception_to_error_data(exc)
    if error is None:
        log.exception("handler for %r raised", METHOD)
        error = ErrorData(code=0, message=str(exc))
    return error


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, whose sessions' transports are ``Transport``s."""

    def __init__(self, calls: ToolCalls, endpoint: EndpointOf, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls, self.endpoint = calls, endpoint
        self.answered = 0  # tools/call requests the transports answered themselves

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        """The SDK's admission (its session limit, its owner record), with this transport."""
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = Transport(
            self,
            mcp_session_id=uuid4().hex,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        session_id = transport.mcp_session_id
        assert session_id is not None
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        return transport
