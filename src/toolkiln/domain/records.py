"""Record types for workspaces, tokens, policies, audit rows and pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from toolkiln.domain import limits
from toolkiln.domain.egress import check_rules
from toolkiln.domain.problems import Problem, problem, text_problems
from toolkiln.domain.text import is_label

T = TypeVar("T")

BUILTIN_NAMES = (
    "calculate",
    "send_email",
    "web_search",
    "surface_file",
    "run_code",
    "http_request",
)


@dataclass(slots=True)
class Workspace:
    id: str
    name: str
    created_at: datetime


@dataclass(slots=True)
class TokenRecord:
    id: str
    workspace_id: str
    scopes: frozenset[str]
    name: str | None
    token_hash: str
    created_at: datetime
    revoked_at: datetime | None = None


@dataclass(slots=True)
class Policy:
    """What a workspace's tools and agents may do."""

    email_allowlist: list[str] = field(default_factory=list)
    builtins: list[str] = field(default_factory=lambda: list(BUILTIN_NAMES))
    max_timeout_ms: int = limits.MAX_TIMEOUT_MS
    egress: list[str] = field(default_factory=list)  # hosts a model's http_request may reach
    # Whether requests may reach private, loopback, link-local and CGNAT addresses.
    egress_private: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "email_allowlist": list(self.email_allowlist),
            "builtins": list(self.builtins),
            "max_timeout_ms": self.max_timeout_ms,
            "egress": list(self.egress),
            "egress_private": self.egress_private,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Policy:
        raw = raw or {}
        return cls(
            email_allowlist=list(raw.get("email_allowlist", [])),
            builtins=list(raw.get("builtins", BUILTIN_NAMES)),
            max_timeout_ms=int(raw.get("max_timeout_ms", limits.MAX_TIMEOUT_MS)),
            egress=list(raw.get("egress", [])),
            egress_private=bool(raw.get("egress_private", False)),
        )


def check_policy(policy: Policy) -> list[Problem]:
    out: list[Problem] = []
    for i, entry in enumerate(policy.email_allowlist):
        f = f"email_allowlist.{i}"
        if not entry or len(entry) > 254 or any(c.isspace() for c in entry) or entry.count("@") > 1:
            out.append(problem(f, "must be an address (a@b.com) or a domain (example.org)"))
        out += text_problems(f, entry)
    for i, name in enumerate(policy.builtins):
        if name not in BUILTIN_NAMES:
            out.append(problem(f"builtins.{i}", f"unknown built-in; known: {list(BUILTIN_NAMES)}"))
    out += check_rules(policy.egress)
    if not limits.MIN_TIMEOUT_MS <= policy.max_timeout_ms <= limits.MAX_TIMEOUT_MS:
        out.append(
            problem(
                "max_timeout_ms",
                f"must be between {limits.MIN_TIMEOUT_MS} and {limits.MAX_TIMEOUT_MS}",
            )
        )
    return out


def check_label(field_name: str, value: str | None, required: bool = True) -> list[Problem]:
    """Names of workspaces, tokens and agents: short, visible, trimmed (``text.LABEL_PATTERN``)."""
    if value is None:
        return [problem(field_name, "is required")] if required else []
    if not value.strip():
        return [problem(field_name, "must not be empty")]
    if len(value) > limits.MAX_LABEL_CHARS:
        return [problem(field_name, f"must be at most {limits.MAX_LABEL_CHARS} characters")]
    if bad := text_problems(field_name, value):
        return bad
    if not is_label(value):
        return [
            problem(
                field_name,
                "must not contain control or format characters, nor start or end with a space",
            )
        ]
    return []


# Every change that can alter some agent's tool list (or code-mode description) leaves one of
# these audit rows, in the transaction of the change: the row bumps its workspace's list
# version (storage/lists_repo.py), which the cached lists are keyed by, and wakes the MCP
# clients' list-change watcher (mcp_server/server.py). tests/api/test_list_cache.py.
LIST_CHANGING_EVENTS = (
    "tool.created",
    "tool.updated",
    "tool.deleted",
    "tool.enabled",
    "tool.disabled",
    "agent.tool_enabled",
    "agent.tool_disabled",
    "agent.deleted",
    "workspace.policy_updated",
)


@dataclass(slots=True)
class AuditRow:
    workspace_id: str
    event: str
    source: str = "api"
    tool_id: str | None = None
    tool_call_id: str | None = None
    agent_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    seq: int | None = None  # the row's place in the table (shared by every workspace)
    id: str | None = None  # what clients see: ``seq`` sealed (domain/opaque.py)


@dataclass(slots=True)
class AuditFilter:
    workspace_id: str | None = None
    tool_id: str | None = None
    tool_call_id: str | None = None
    agent_id: str | None = None
    event: str | None = None


@dataclass(slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


@dataclass(slots=True)
class CountResult:
    """What one atomic counter update did."""

    found: bool
    failure_count: int
    status: str
    just_disabled: bool


@dataclass(slots=True)
class CallRecord:
    """A stored tool call: its Result, for GET /v1/tool-calls/{id}."""

    id: str
    workspace_id: str
    tool_id: str | None
    version: int | None
    kind: str
    status: str
    error_code: str | None
    result: dict[str, Any]
    agent_id: str | None
    created_at: datetime


@dataclass(slots=True)
class Agent:
    id: str
    workspace_id: str
    name: str
    created_at: datetime
