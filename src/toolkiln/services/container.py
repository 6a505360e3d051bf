"""The set of use cases a transport needs, built once by the composition root."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from toolkiln.services.access import AccessService
from toolkiln.services.agents import AgentService
from toolkiln.services.audit import AuditService
from toolkiln.services.background import ChangeFeed, Supervisor
from toolkiln.services.files import FileService
from toolkiln.services.generate import GenerateService
from toolkiln.services.invoke import InvokeService
from toolkiln.services.outbox import OutboxService
from toolkiln.services.places import Places
from toolkiln.services.ports import CallObserver, NoObserver
from toolkiln.services.router import Router
from toolkiln.services.secrets import SecretService
from toolkiln.services.system import SystemService
from toolkiln.services.tools import ToolService


@dataclass(slots=True)
class Services:
    access: AccessService
    tools: ToolService
    audit: AuditService
    system: SystemService
    invoke: InvokeService
    router: Router
    files: FileService
    outbox: OutboxService
    agents: AgentService
    generate: GenerateService
    secrets: SecretService
    # A new feed for each watcher (each holds its own LISTEN connection on PostgreSQL).
    changes: Callable[[], ChangeFeed]
    # The service's background loops; /healthz reports theirs.
    background: Supervisor = field(default_factory=Supervisor)
    # Admission of long work, shared by every use case that starts some (services/places.py).
    places: Places = field(default_factory=Places)
    # What calls came to, counted for /metrics (api/call_metrics.py).
    observer: CallObserver = field(default_factory=NoObserver)
