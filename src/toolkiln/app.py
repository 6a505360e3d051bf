"""The composition root: builds the concrete pieces from settings and wires them together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI

from toolkiln.api.app import create_app
from toolkiln.config import Settings
from toolkiln.services.access import AccessService
from toolkiln.services.audit import AuditService
from toolkiln.services.container import Services
from toolkiln.services.system import SystemService
from toolkiln.services.tools import ToolService
from toolkiln.storage.database import Database


@dataclass(slots=True)
class Runtime:
    """Everything a running Toolkiln holds, so that it can be closed in one place."""

    settings: Settings
    database: Database
    services: Services

    def close(self) -> None:
        self.database.dispose()


def build(settings: Settings, *, migrate: bool = True) -> Runtime:
    settings.ensure_data_dir()
    database = Database(settings.resolved_database_url(), pool_size=settings.db_pool_size)
    if migrate:
        database.migrate()
    uow = database.transaction
    services = Services(
        access=AccessService(uow),
        tools=ToolService(uow),
        audit=AuditService(uow),
        system=SystemService(database.ping),
    )
    return Runtime(settings, database, services)


def build_app(runtime: Runtime) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            runtime.close()

    token = runtime.settings.metrics_token
    return create_app(
        runtime.services,
        metrics_token=token.get_secret_value() if token else None,
        lifespan=lifespan,
    )
