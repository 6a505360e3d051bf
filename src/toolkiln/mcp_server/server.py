"""An MCP server whose tools are an agent's tools, on the SDK's low-level ``Server``.

Tools live in the database, so the low-level server (``on_list_tools``/``on_call_tool``) fits
better than the decorator layer: both handlers ask the services, which apply the same
scopes, enablement and audit as the REST API.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp.types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import ValidationError

import toolkiln
from toolkiln.api.offload import Offload
from toolkiln.domain.auth import Bearer, Principal
from toolkiln.domain.errors import ToolkilnError, TooManyRequests
from toolkiln.domain.results import Result
from toolkiln.mcp_server.render import error_text
from toolkiln.services import tracing
from toolkiln.services.background import Loop
from toolkiln.services.calls import CallContext
from toolkiln.services.container import Services


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Who calls, for which agent, and how its tools are offered (``mode``: direct | code)."""

    principal: Principal
    agent_id: str
    mode: str = "direct"
    language: str = "python"
    names: str = "id"  # custom_{id}, or "name": their own names where they can be


Resolve = Callable[[ServerRequestContext[Any, Any]], Awaitable[Endpoint]]


log = logging.getLogger("toolkiln.mcp")
T = TypeVar("T")
# The feed wakes the watcher sooner (a NOTIFY, or a poll every second on SQLite).
MAX_WAIT_S = 30.0
# How far below the newest audit id a list-changing row may still appear (committed late):
# ids are shared with every call's rows, so this is seconds to minutes of a busy service.
WINDOW_IDS = 10_000
# A look reads only rows over the newest id a look made this long ago saw: a row's id is
# taken less than this long before its commit (a transaction's statements end within 5 s;
# looks come at least every MAX_WAIT_S), so the rows under it were all seen
# (tests/mcp/test_list_watcher.py::test_a_look_reads_only_recent_rows).
LATE_S = 120.0
MAX_SESSIONS = 1000
# Open subscriptions/listen streams: at most this many in all, and a quarter of them for
# one workspace's agents, so one tenant's streams cannot use up another's.
MAX_LISTEN_STREAMS = 1024
MAX_LISTEN_PER_WORKSPACE = 256
CALL_THREADS = 64  # tools/call requests running at once (more wait for a thread)


class Listeners:
    """Who to tell when tool lists change, by the workspace of the agent each client is
    connected to: clients that use ``subscriptions/listen`` listen on their workspace's
    bus; handshake-era clients get ``notifications/tools/list_changed`` on their session,
    for which we remember each session that listed tools, with its workspace.

    A change is told to its own workspace's clients alone (an agent offers only its
    workspace's tools): telling every client would let one tenant watch another's
    activity (when it edited tools, when a tool of its was disabled after three failures;
    tests/security/test_mcp_scoping.py). Listen streams are capped per workspace,
    so one tenant's streams cannot use up another's."""

    def __init__(self) -> None:
        self._listen: dict[str, tuple[InMemorySubscriptionBus, ListenHandler]] = {}
        self.streams = 0  # listen streams open, every workspace's
        # Strong references, newest last: the SDK hands out session objects we cannot weakly
        # reference for long. A closed one fails to send and is dropped; the cap bounds growth.
        self.sessions: dict[int, tuple[Any, str]] = {}

    def remember(self, session: Any, workspace_id: str) -> None:
        """Past the cap, the oldest session of the workspace holding the most is forgotten:
        a workspace's sessions push out its own, never another's
        (tests/security/test_mcp_sessions_share.py)."""
        self.sessions.pop(id(session), None)
        self.sessions[id(session)] = (session, workspace_id)
        while len(self.sessions) > MAX_SESSIONS:
            held = Counter(ws for _, ws in self.sessions.values())
            most = max(held, key=held.__getitem__)
            self.sessions.pop(next(k for k, (_, ws) in self.sessions.items() if ws == most))

    def listen_handler(self, workspace_id: str) -> ListenHandler:
        """The SDK's ``subscriptions/listen`` handler over this workspace's own bus."""
        found = self._listen.get(workspace_id)
        if found is None:
            bus = InMemorySubscriptionBus()
            handler = ListenHandler(bus, max_subscriptions=MAX_LISTEN_PER_WORKSPACE)
            found = self._listen[workspace_id] = (bus, handler)
        return found[1]

    async def changed(self, workspaces: Collection[str] | None) -> None:
        """Tell the clients of these workspaces (``None``: of every workspace)."""

        def told(workspace_id: str) -> bool:
            return workspaces is None or workspace_id in workspaces

        log.debug(
            "tool lists changed in %s",
            "every workspace" if workspaces is None else f"{len(workspaces)} workspace(s)",
        )
        for workspace_id, (bus, _) in list(self._listen.items()):
            if told(workspace_id):
                await bus.publish(ToolsListChanged())
        for key, (session, workspace_id) in list(self.sessions.items()):
            if not told(workspace_id):
                continue
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # a closed session: forget it
                log.debug("tool list change not delivered: %s", exc)
                self.sessions.pop(key, None)


def tool_list_watcher(services: Services, listeners: Listeners) -> Loop:
    """A loop (for ``services.background``) that tells the listening clients of a workspace
    when some agent's tools there may have changed.

    The rows are read from the database, so changes made through another replica are seen
    too; ``services.changes`` wakes the loop (PostgreSQL NOTIFY, or a poll). Every listener
    of a workspace with a change is told (not only the affected agent's); clients list
    again. Each look reads the list-changing rows among the last ``WINDOW_IDS`` audit ids
    and tells the workspaces of those not told before: on PostgreSQL ids are taken at
    insert and rows become visible at commit, so a row can appear below the newest id
    seen (a look that only read ids over the last newest one would miss it for good). What
    was told outlives a restart of the loop, so a change made while the database was away is
    told once it is back.
    """
    told: set[int] | None = None  # the rows in the window at the last look
    newest = 0
    looks: deque[tuple[float, int]] = deque()  # (when, newest id) of the recent looks

    async def watch(healthy: Callable[[], None]) -> None:
        nonlocal told, newest
        feed = services.changes()
        try:
            await feed.wait(0)  # listening before the first look
            while True:
                now = time.monotonic()
                while len(looks) > 1 and looks[1][0] <= now - LATE_S:
                    looks.popleft()
                floor = looks[0][1] if looks and looks[0][0] <= now - LATE_S else 0
                marker, rows = await anyio.to_thread.run_sync(
                    services.agents.list_changes, WINDOW_IDS, floor
                )
                healthy()
                if told is not None and marker < newest:  # the database went back
                    looks.clear()
                    await listeners.changed(None)
                elif told is not None:
                    fresh = {workspace for i, workspace in rows if i not in told}
                    if fresh:
                        await listeners.changed(fresh)
                told, newest = {i for i, _ in rows}, marker
                looks.append((now, marker))
                await feed.wait(MAX_WAIT_S)
        finally:
            with anyio.CancelScope(shield=True):
                await feed.aclose()

    return watch


class _Server(Server[Any]):
    """Advertises ``tools.listChanged`` to handshake-era clients by default."""

    def create_initialization_options(
        self, notification_options: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        options = notification_options or NotificationOptions(tools_changed=True)
        return super().create_initialization_options(options, *args, **kwargs)


def _failed(error: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=error_text(error))],
        structured_content={"error": error},
        is_error=True,
    )


class _Traced:
    """The outermost middleware of the server: every MCP message it receives (a request or a
    notification; ``initialize``; a method it does not serve, answered as an error) in one
    span (``tracing.mcp_message``), with what it came to. It stands in for the SDK's own
    middleware, whose spans go to the global tracer provider Toolkiln never sets: one span
    per message (tests/api/test_traces.py)."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if not tracing.on():
            return await call_next(ctx)
        headers = getattr(ctx.request, "headers", None)  # streamable HTTP's request; stdio: none
        with tracing.mcp_message(
            ctx.method,
            ctx.params,
            ctx.meta,
            request_id=ctx.request_id,
            protocol_version=ctx.protocol_version,
            session_id=headers.get("mcp-session-id") if headers is not None else None,
            transport="pipe" if ctx.request is None else "tcp",
        ) as span:
            try:
                result = await call_next(ctx)
            except Exception as exc:
                failed_in(span, exc)
                raise
            if ctx.method == "tools/call" and isinstance(result, dict) and result.get("isError"):
                tracing.mcp_answered(span, "tool_error")
            return result


def failed_in(span: Any, exc: Exception) -> None:
    """What an MCP message's span says of the error it came to (``error.type``): the
    JSON-RPC error's code, ``INVALID_PARAMS`` for params that are not valid, a Toolkiln
    error's code, else the exception's type (tests/api/test_traces.py)."""
    if isinstance(exc, MCPError):
        tracing.mcp_answered(span, str(exc.error.code), exc.error.code)
    elif isinstance(exc, ValidationError):
        tracing.mcp_answered(span, str(INVALID_PARAMS), INVALID_PARAMS)
    elif isinstance(exc, ToolkilnError):
        tracing.mcp_answered(span, exc.code)
    else:
        tracing.mcp_answered(span, type(exc).__qualname__)


def shaped(outcome: Result | TooManyRequests) -> types.CallToolResult:
    """A call's Result as an MCP client sees it; a run over the workspace's share of long
    work (run_program, run_code) is a failed result, not an error
    (tests/security/test_slow_work.py)."""
    if isinstance(outcome, TooManyRequests):
        return _failed(
            {"code": outcome.code, "message": outcome.message, "details": outcome.details}
        )
    if outcome.error is not None:
        return _failed(outcome.error)
    raw = outcome.raw_data
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(outcome.llm or outcome.message or ""))],
        structured_content=raw if isinstance(raw, dict) else {"result": raw},
        is_error=False,
    )


class ToolCalls:
    """A ``tools/call``'s run, for the SDK's handler and for the fast answer alike
    (mcp_server/fast.py): on a pool of threads of its own (api/offload.py), not anyio's
    default limiter, which serves the REST API's reads and token checks (slow tools cannot
    hold those up), taken in turns by workspace (services/turns.py: no one workspace holds
    them all; tests/security/test_slow_work.py)."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self._pool = Offload(CALL_THREADS, "toolkiln-mcp", reserve=CALL_THREADS // 4)

    async def __call__(
        self,
        at: Endpoint,
        name: str,
        arguments: dict[str, Any],
        session: Any = None,
        said: list[str] | None = None,
    ) -> types.CallToolResult:
        """The call's result as the client sees it (``shaped``). Given the request's
        ``session``, the tool's status line is sent to it as progress while the run starts
        (the run not waiting for it), and kept in ``said``."""
        call = functools.partial(self.dispatch, at, name, arguments)
        turn = at.principal.workspace_id
        try:
            if session is None:
                result = await self._pool(call, turn=turn)
            else:
                result = await self._told(call, turn, session, said)
        except TooManyRequests as exc:
            return shaped(exc)
        return shaped(result)

    def dispatch(
        self,
        at: Endpoint,
        name: str,
        arguments: dict[str, Any],
        on_status: Callable[[str], None] | None = None,
    ) -> Result:
        """On a thread: the call (``AgentService.dispatch``)."""
        agents = self._services.agents
        return agents.dispatch(
            at.principal, at.agent_id, name, arguments, CallContext(), at.mode, on_status
        )

    def enter_and_dispatch(
        self,
        bearer: str | None,
        agent_id: str,
        mode: str,
        name: str,
        arguments: dict[str, Any],
        entered: Callable[[], None],
    ) -> Result:
        """On a thread: the call of a request whose token and agent are not checked yet,
        checked first in the call's own read (``AgentService.dispatch`` given ``entered``,
        called once they passed)."""
        agents = self._services.agents
        return agents.dispatch(
            Bearer(bearer), agent_id, name, arguments, CallContext(), mode, entered=entered
        )

    async def run(self, fn: Callable[[], T], turn: str) -> T:
        """``fn()`` on the pool, once it is ``turn``'s turn (a workspace id)."""
        return await self._pool(fn, turn=turn)

    async def _told(
        self, call: Callable[..., Result], turn: str, session: Any, said: list[str] | None
    ) -> Result:
        loop = asyncio.get_running_loop()
        sent: list[concurrent.futures.Future[None]] = []

        def tell(status: str) -> None:  # on the call's thread, its call prepared
            if said is not None:
                said.append(status)
            progress = session.report_progress(0, 1, status)
            sent.append(asyncio.run_coroutine_threadsafe(progress, loop))

        try:
            return await self._pool(functools.partial(call, on_status=tell), turn=turn)
        finally:
            for told in sent:  # sent before the answer
                await asyncio.wrap_future(told)

    def close(self) -> None:
        self._pool.close()


def make_server(
    services: Services, resolve: Resolve, listeners: Listeners, calls: ToolCalls | None = None
) -> Server[Any]:
    """``resolve`` tells, for each request, who calls and for which agent; ``listeners``
    is where tool-list changes go; ``calls`` runs the tool calls (its own when not given:
    streamable HTTP shares its with the fast answer, mcp_server/fast.py)."""
    calls = calls or ToolCalls(services)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        at = await resolve(ctx)

        listing = await anyio.to_thread.run_sync(
            lambda: services.agents.listing(
                at.principal, at.agent_id, "mcp", mode=at.mode, language=at.language, names=at.names
            )
        )
        listeners.remember(ctx.session, listing.workspace_id)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=e["name"],
                    description=e["description"],
                    input_schema=e["inputSchema"],
                    annotations=types.ToolAnnotations(
                        open_world_hint=e["annotations"]["openWorldHint"]
                    ),
                )
                for e in listing.entries
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        at = await resolve(ctx)
        said: list[str] = []
        result = await calls(at, params.name, params.arguments or {}, ctx.session, said)
        if said:
            await ctx.session.report_progress(1, 1, said[0])
        return result

    async def listen(
        ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        at = await resolve(ctx)
        agent = await anyio.to_thread.run_sync(
            lambda: services.agents.get(at.principal, at.agent_id)
        )
        if listeners.streams >= MAX_LISTEN_STREAMS:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        listeners.streams += 1
        try:
            return await listeners.listen_handler(agent.workspace_id)(ctx, params)
        finally:
            listeners.streams -= 1

    server = _Server(
        "toolkiln",
        version=toolkiln.__version__,
        instructions="Custom and built-in tools of one Toolkiln agent.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_subscriptions_listen=listen,
    )
    server.middleware = [_Traced()]
    return server
