"""A ``tools/call`` on an initialized streamable HTTP session, answered by the session's
transport itself instead of through the SDK's session machinery (its message streams, the
dispatcher's task per request, sse-starlette's task group per answer): the same call
(``ToolCalls``), the same checks (the token's and the agent's made in the call's own read),
the same result, error and span, one event on the wire
(docs/decisions/181-mcp-calls-answered-by-the-transport.md).

Only a request the SDK would serve as the plain case is taken: a POST the transport accepts
(its DNS-rebinding check, session id and idle clock are the SDK's, run before this), that
accepts an event stream, is declared JSON and parses as one JSON-RPC ``tools/call`` request
whose params the SDK's own models find valid, on a session whose ``initialize`` was
accepted, with no ``progressToken`` (the status line is sent as progress while the run
starts: the SDK's path does that). Anything else goes on to the SDK, which answers it as it
always did. tests/mcp/test_fast_calls.py sends both paths the same requests."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import mcp.types as types
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.streamable_http import (
    CONTENT_TYPE_JSON,
    MCP_SESSION_ID_HEADER,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import (
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp_types import (
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    jsonrpc_message_adapter,
)
from mcp_types import methods as spec
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from opentelemetry.trace import Span
from pydantic import ValidationError
from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from toolkiln.domain.errors import ToolkilnError, TooManyRequests
from toolkiln.mcp_server.entrance import Entrance, entrance_of, refusal
from toolkiln.mcp_server.server import ToolCalls, failed_in, shaped
from toolkiln.services import tracing
from toolkiln.services.container import Services

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


class _Refused(Exception):
    """The request's token or agent was refused by the entrance's checks: ``error``."""

    def __init__(self, error: ToolkilnError) -> None:
        self.error = error


class Transport(StreamableHTTPServerTransport):
    """The SDK's transport for one session, but a plain ``tools/call`` (above) is answered
    here, the request's token and agent checked first in the call's own read."""

    peer: ServerSession | None = None

    def __init__(self, manager: SessionManager, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._manager = manager

    @property
    def initialized(self) -> bool:
        """Whether the session's ``initialize`` was accepted (as its SDK runner saw it)."""
        return self.peer is not None and self.peer.client_params is not None

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        scope[_TRANSPORT] = self
        entrance = entrance_of(scope)
        call = await self._plain_call(request)
        if call is None:  # the SDK's, once the request's check passed
            if entrance.endpoint is None:  # left to this transport (SessionManager.may_answer)
                refused = await entrance.entered(self._manager.services)
                if refused is not None:
                    await refused(scope, receive, send)
                    return
            # The SDK reads the body request.body() kept.
            await super()._handle_post_request(scope, request, receive, send)
            return
        try:
            answer = await self._manager.calls.run(
                functools.partial(self._answer, entrance, call),
                entrance.endpoint.principal.workspace_id
                if entrance.endpoint is not None
                else self._manager.services.invoke.turn_key(entrance.bearer),
            )
        except _Refused as exc:
            await refusal(exc.error)(scope, receive, send)
            return
        except TooManyRequests as exc:  # no turn for it: a failed result, as ToolCalls answers
            answer = _result(
                call, shaped(exc).model_dump(by_alias=True, mode="json", exclude_none=True)
            )
        self._manager.answered += 1
        data = (
            answer.model_dump_json(by_alias=True, exclude_unset=True)
            if isinstance(answer, JSONRPCError)
            else answer
        )
        headers = {**_HEADERS, MCP_SESSION_ID_HEADER: self.mcp_session_id or ""}
        await Response(ServerSentEvent(data, event="message").encode(), headers=headers)(
            scope, receive, send
        )

    async def _plain_call(self, request: Request) -> _Call | None:
        """The request as a call this transport answers itself; None for the SDK."""
        peer = self.peer
        if peer is None or not self.initialized:
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

    def _answer(self, entrance: Entrance, call: _Call) -> str | JSONRPCError:
        """On the call's thread: what the SDK's runner and dispatcher answer for the
        request, in the message's one span, begun once the request's token and agent passed
        the entrance's checks, which the call's own read makes first (``AgentService.
        dispatch`` given ``entered``); a ToolkilnError raised before is their refusal
        (``_Refused``), answered as the endpoint answers it, with no span."""
        meta = call.params.get("_meta")
        opened = contextlib.ExitStack()
        spans: list[Span] = []

        def entered() -> None:
            spans.append(
                opened.enter_context(
                    tracing.mcp_message(
                        METHOD,
                        call.params,
                        meta if isinstance(meta, Mapping) else None,
                        request_id=call.id,
                        protocol_version=call.version,
                        session_id=self.mcp_session_id,
                        transport="tcp",
                    )
                )
            )

        with opened:
            name, arguments = call.typed.name, call.typed.arguments or {}
            try:
                if entrance.endpoint is not None:  # checked before (McpHttp)
                    entered()
                    result = self._manager.calls.dispatch(entrance.endpoint, name, arguments)
                else:
                    result = self._manager.calls.enter_and_dispatch(
                        entrance.bearer, entrance.agent_id, entrance.mode, name, arguments, entered
                    )
                dumped = shaped(result).model_dump(by_alias=True, mode="json", exclude_none=True)
            except ToolkilnError as exc:
                if not spans:
                    raise _Refused(exc) from None
                if not isinstance(exc, TooManyRequests):
                    failed_in(spans[0], exc)
                    return JSONRPCError(jsonrpc="2.0", id=call.id, error=_error_of(exc))
                dumped = shaped(exc).model_dump(by_alias=True, mode="json", exclude_none=True)
            except Exception as exc:
                if not spans:
                    raise
                failed_in(spans[0], exc)
                return JSONRPCError(jsonrpc="2.0", id=call.id, error=_error_of(exc))
            if dumped.get("isError"):
                tracing.mcp_answered(spans[0], "tool_error")
            return _result(call, dumped)


def _result(call: _Call, dumped: dict[str, Any]) -> str:
    """The call's JSONRPCResponse as JSON, by pydantic's encoder, with no model built for it."""
    result = spec.serialize_server_result(METHOD, call.version, dumped)
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": call.id, "result": result}).decode()


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

    def __init__(self, services: Services, calls: ToolCalls, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.services, self.calls = services, calls
        self.answered = 0  # tools/call requests the transports answered themselves

    def may_answer(self, scope: Scope, headers: Mapping[str, str]) -> bool:
        """Whether the request may be one its session's transport answers itself, and so
        have its token and agent checked there: a POST declared JSON, of a protocol version
        of the handshake era, on an initialized session this manager serves. What the SDK
        refuses before a transport's POST handling (a session not found or ended, a body
        not declared JSON, a version of another era) is thus never refused here before the
        token is checked, nor is a session used with a token other than its owner's
        (tests/mcp/test_fast_calls.py, tests/mcp/test_fast_review.py)."""
        if scope["method"] != "POST":
            return False
        if not headers.get("content-type", "").lower().startswith(CONTENT_TYPE_JSON):
            return False
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return False
        session_id = headers.get(MCP_SESSION_ID_HEADER, "")
        transport = self._server_instances.get(session_id)
        user = scope.get("user")  # McpHttp's: the request's token (the session's owner?)
        if not isinstance(user, AuthenticatedUser):
            return False
        return (
            self._session_owners.get(session_id) == authorization_context(user)
            and isinstance(transport, Transport)
            and transport.initialized
            and not transport.is_terminated
            and (transport.idle_scope is None or not transport.idle_scope.cancel_called)
        )

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
