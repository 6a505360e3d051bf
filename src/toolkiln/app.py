"""The composition root: builds the concrete pieces from settings and wires them together."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI

from toolkiln import logs, telemetry, web
from toolkiln.api.app import create_app
from toolkiln.api.call_metrics import CallMetrics
from toolkiln.builtins.calculate import Calculate
from toolkiln.builtins.email import SendEmail, SmtpConfig
from toolkiln.builtins.files import SurfaceFile
from toolkiln.builtins.http import HttpRequest
from toolkiln.builtins.reach import ssl_context
from toolkiln.builtins.search import WebSearch, make_provider
from toolkiln.config import Settings
from toolkiln.domain.analysis import Analysis
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.domain.opaque import KEY_BYTES, Positions
from toolkiln.mcp_server.http import McpHttp
from toolkiln.runners.analyser import RemoteAnalyser
from toolkiln.runners.fleet import Fleet, RemoteRunner
from toolkiln.runners.local import LocalRunner, channel_credentials
from toolkiln.sandbox import patterns
from toolkiln.services import stats
from toolkiln.services.access import AccessService
from toolkiln.services.agents import AgentService
from toolkiln.services.analysis import CachedAnalyser
from toolkiln.services.audit import AuditService
from toolkiln.services.background import Loop, Supervisor
from toolkiln.services.container import Services
from toolkiln.services.dispatch import Builtins
from toolkiln.services.files import FileService
from toolkiln.services.files import pruner as files_pruner
from toolkiln.services.generate import GenerateService
from toolkiln.services.invoke import DraftRunner, InvokeService
from toolkiln.services.outbox import OutboxService
from toolkiln.services.places import Places, PlacesConfig
from toolkiln.services.ports import (
    BuiltinTool,
    ChatModel,
    CodeAnalyser,
    CodeRunner,
    UnitOfWorkFactory,
)
from toolkiln.services.router import Router
from toolkiln.services.runs import Runs
from toolkiln.services.secrets import SecretService
from toolkiln.services.system import SystemService
from toolkiln.services.testcases import CaseRunner
from toolkiln.services.tools import ToolService
from toolkiln.storage.database import Database
from toolkiln.storage.notify import feed_for
from toolkiln.storage.sealing import ring_for

if TYPE_CHECKING:  # the checkers run on a runner; this process never loads them
    from toolkiln.sandbox.checks import CheckerPool

log = logging.getLogger("toolkiln")


@dataclass(slots=True)
class Runtime:
    """Everything a running Toolkiln holds, so that it can be closed in one place.
    ``sandboxes`` and ``checks`` (the code checkers, sandbox/checks.py): only with a runner
    hosted in this process (``build(hosted=True)``)."""

    settings: Settings
    database: Database
    services: Services
    fleet: Fleet | None = None
    sandboxes: dict[str, Any] = field(default_factory=dict)
    checks: CheckerPool | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def loops(self) -> dict[str, Loop]:
        """The background loops a long-running process of this runtime keeps (``serve``,
        ``mcp``), besides the MCP watcher: the pruning of stats and expired files; on SQLite,
        the WAL checkpoint."""
        found: dict[str, Loop] = {
            "stats.prune": stats.pruner(self.database.transaction),
            "files.prune": files_pruner(self.services.files),
        }
        if self.database.is_sqlite:
            found["storage.checkpoint"] = self.database.checkpointer
        return found

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()
        self.sandboxes.clear()
        self.checks = None
        self.database.dispose()


def _keep_out_of_logs(settings: Settings) -> None:
    """Every credential the settings hold, redacted from every log line (toolkiln/logs.py)."""
    logs.install()
    for secret in (
        settings.bootstrap_token,
        settings.metrics_token,
        settings.llm_api_key,
        settings.search_api_key,
        settings.file_signing_key,
        settings.runner_token,
    ):
        if secret is not None:
            logs.protect(secret.get_secret_value())
    # Endpoints whose path may hold a token (a gateway's /t0k3n.../v1): those segments too.
    for url in (settings.llm_base_url, settings.search_url):
        logs.protect(*logs.secrets_of_url(url))
    smtp = settings.smtp_url.get_secret_value() if settings.smtp_url else None
    for url in (smtp, settings.database_url):
        logs.protect(*logs.credentials_of_url(url))


def _signing_key(settings: Settings, database: Database) -> bytes:
    """The key of file links: TOOLKILN_FILE_SIGNING_KEY, else one generated once and kept in
    the database, so every replica signs and accepts the same links."""
    if settings.file_signing_key is not None:
        return settings.file_signing_key.get_secret_value().encode()
    seed = settings.legacy_signing_key() or secrets.token_hex(32)
    return database.shared_secret("file_signing_key", seed).encode()


def _positions_key(database: Database) -> bytes:
    """The key that seals audit ids and list cursors (domain/opaque.py): generated once and
    kept in the database, so every replica issues and accepts the same strings."""
    return bytes.fromhex(database.shared_secret("positions_key", secrets.token_hex(KEY_BYTES)))


def build(
    settings: Settings, *, migrate: bool = True, sandbox: bool = True, hosted: bool = False
) -> Runtime:
    """``sandbox=False`` for CLI commands that only touch the database. The code runs on
    runners: ``TOOLKILN_RUNNERS``', else one started as a child process
    (the embedded default); ``hosted=True`` serves a runner from this process instead,
    reached over the same gRPC, for tests that look inside its sandboxes."""
    _keep_out_of_logs(settings)
    telemetry.configure(record_io=settings.trace_tool_io)  # off without OTEL_* settings
    settings.ensure_data_dir()
    database = Database(settings.resolved_database_url(), pool_size=settings.db_pool_size)
    if migrate and (revision := database.migrate()):
        log.info("migrated the database to revision %s", revision)
    closers: list[Callable[[], None]] = [database.dispose]
    fleet: Fleet | None = None
    host: Any = None
    runners: dict[str, CodeRunner] = {}
    analyser: CodeAnalyser = _NoAnalyser()
    if sandbox:
        try:
            fleet, host = _fleet(settings, closers, hosted)
        except BaseException:
            _close_all(closers)
            raise
        runners = {n: RemoteRunner(n, fleet) for n in ("python", "javascript")}
        # Tool code is analysed by the runners' code checkers only, each text once per
        # workspace (the answers kept here).
        analyser = CachedAnalyser(RemoteAnalyser(fleet))
    closers.remove(database.dispose)  # Runtime.close disposes of it last
    uow = database.transaction
    signing_key = _signing_key(settings, database)
    logs.protect(signing_key.decode())
    files = FileService(
        uow,
        signing_key,
        settings.resolved_public_url(),
        quota_bytes=settings.files_per_workspace_mb * 1024 * 1024,
        quota_files=settings.files_per_workspace,
    )
    observer = CallMetrics(lambda: database.problem() is None)
    runs = Runs(uow, runners, observer)
    places = Places(
        PlacesConfig(
            settings.long_work_per_workspace,
            settings.long_work_total,
            settings.long_work_retry_after_s,
        )
    )
    secrets_ = SecretService(uow, ring_for(settings.secrets_key_list(), settings.data_dir))
    searcher = patterns.shared()  # a tool's regular expressions, out of the service's way
    router = Router(
        uow,
        Builtins(_builtins(settings, uow, files, secrets_)),
        runs,
        analyser,
        places,
        observer,
        searcher=searcher,
    )
    drafts = DraftRunner(router, runs)  # test runs and test cases: uncounted runs of a draft
    positions = Positions(_positions_key(database))
    audit = AuditService(uow, positions)
    cases = CaseRunner(drafts.run, places=places)
    tools = ToolService(uow, analyser, cases, runs.prepare, positions=positions, searcher=searcher)
    invoke = InvokeService(uow, router, tools, drafts, audit, places)
    background = Supervisor()
    system = SystemService(
        database.problem,
        lambda: {n: r.describe() for n, r in runners.items()},
        background.health,
        fleet.status if fleet is not None else None,
    )
    services = Services(
        access=AccessService(uow),
        tools=tools,
        audit=audit,
        system=system,
        invoke=invoke,
        router=router,
        files=files,
        outbox=OutboxService(uow, positions),
        agents=AgentService(uow, router, invoke.hints),
        generate=GenerateService(
            uow,
            tools,
            _chat_model(settings),
            system.runtimes,
            router.specs,
            settings.llm_max_attempts,
            places,
        ),
        secrets=secrets_,
        changes=lambda: feed_for(database.url),
        background=background,
        places=places,
        observer=observer,
    )
    sandboxes = host.sandboxes if host is not None else {}
    checks = host.checks if host is not None else None
    return Runtime(settings, database, services, fleet, sandboxes, checks, closers)


class _NoAnalyser:
    """The ``CodeAnalyser`` of commands built without runners (``sandbox=False``)."""

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        raise ServiceUnavailable("This command checks no tool code (it has no runner).")


def _fleet(
    settings: Settings, closers: list[Callable[[], None]], hosted: bool = False
) -> tuple[Fleet, Any]:
    """The runners this process sends code to, and (hosted only) the runner it serves."""
    if settings.runners:
        token = settings.runner_token.get_secret_value() if settings.runner_token else ""
        credentials = channel_credentials(
            settings.runner_tls_ca, settings.runner_tls_cert, settings.runner_tls_key
        )
        targets = [t.strip() for t in settings.runners.split(",") if t.strip()]
        fleet = Fleet(targets, token, credentials)
        closers.append(fleet.close)
        return fleet, None
    host = None
    if hosted:
        from toolkiln.runners.process import hosted_runner

        address, token, host = hosted_runner(settings, closers)
    else:
        local = LocalRunner(settings)
        closers.append(local.stop)
        address, token = local.address, local.token
    fleet = Fleet([address], token)
    closers.append(fleet.close)
    return fleet, host


def _close_all(closers: list[Callable[[], None]]) -> None:
    while closers:
        closers.pop()()


def _chat_model(settings: Settings) -> ChatModel | None:
    if not settings.llm_base_url or not settings.llm_model:
        return None
    # Imported only when configured: the SDK takes about a second to import, which every
    # CLI command would otherwise pay.
    from toolkiln.llm.openai_chat import OpenAIChat

    key = settings.llm_api_key
    return OpenAIChat(
        settings.llm_base_url,
        settings.llm_model,
        key.get_secret_value() if key else None,
        settings.llm_timeout_s,
        settings.llm_max_answer_bytes,
    )


def _builtins(
    settings: Settings, uow: UnitOfWorkFactory, files: FileService, secrets_: SecretService
) -> list[BuiltinTool]:
    smtp = settings.smtp_url
    key = settings.search_api_key
    provider = make_provider(
        settings.search_provider, settings.search_url, key.get_secret_value() if key else None
    )
    return [
        Calculate(),
        SendEmail(uow, SmtpConfig.from_url(smtp.get_secret_value()) if smtp else None),
        WebSearch(provider),
        SurfaceFile(files),
        HttpRequest(
            secrets_,
            context=ssl_context(str(settings.egress_ca_file) if settings.egress_ca_file else None),
        ),
    ]


def build_app(runtime: Runtime, *, close_on_exit: bool = True) -> FastAPI:
    """The HTTP app: MCP at /mcp (its session manager runs in the lifespan), the view at /ui."""
    mcp = McpHttp(runtime.services)

    @asynccontextmanager
    async def lifespan(served: FastAPI) -> AsyncIterator[None]:
        try:
            async with mcp.lifespan(), anyio.create_task_group() as tasks:
                for name, loop in runtime.loops().items():
                    tasks.start_soon(runtime.services.background.run, name, loop)
                try:
                    yield
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            served.state.offload.close()
            if close_on_exit:
                runtime.close()

    token = runtime.settings.metrics_token
    app = create_app(
        runtime.services,
        metrics_token=token.get_secret_value() if token else None,
        lifespan=lifespan,
    )
    app.mount("/mcp", mcp)
    app.state.mcp = mcp
    # Ahead of the API's routes, so that an MCP request is not matched against each of them
    # first (none is under /mcp).
    app.router.routes.insert(0, app.router.routes.pop())
    web.mount(app)
    return app
