"""The schema, in SQLAlchemy Core. Migrations in ``migrations/`` create exactly this."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from toolkiln.domain.limits import MAX_CALL_ID_CHARS
from toolkiln.domain.stats import BUCKETS as STATS_BUCKETS

metadata = sa.MetaData()
JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
Moment = sa.DateTime(timezone=True)
# Rows written before test cases, callers and egress existed read as "none", "everywhere"
# and "no host".
NO_CASES = sa.text("'[]'")
ALL_CALLERS = sa.text('\'["direct", "code"]\'')
NO_EGRESS = sa.text("'[]'")

workspaces = sa.Table(
    "workspaces",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("policy", JSONType, nullable=False),
    sa.Column("created_at", Moment, nullable=False),
    # Moves with every change to what the workspace's agents' tool lists show (the audit
    # rows of domain.records.LIST_CHANGING_EVENTS): the key of the cached lists.
    sa.Column("list_version", sa.BigInteger, nullable=False, server_default=sa.text("0")),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("workspace_id", sa.String(32), sa.ForeignKey("workspaces.id"), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("scopes", sa.String(64), nullable=False),
    sa.Column("name", sa.String(200)),
    sa.Column("created_at", Moment, nullable=False),
    sa.Column("revoked_at", Moment),
)


def _definition() -> list[sa.Column[object]]:
    """The columns of a tool's definition (``domain.tools.Definition``), in the tool's row
    (its current version) and in each row of its history alike."""
    return [
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("language", sa.String(16), nullable=False),
        sa.Column("code", sa.Text, nullable=False),
        sa.Column("input_schema", JSONType, nullable=False),
        sa.Column("timeout_ms", sa.Integer, nullable=False),
        sa.Column("test_cases", JSONType, nullable=False, server_default=NO_CASES),
        sa.Column("allowed_callers", JSONType, nullable=False, server_default=ALL_CALLERS),
        sa.Column("egress", JSONType, nullable=False, server_default=NO_EGRESS),
    ]


tools = sa.Table(
    "tools",
    metadata,
    sa.Column("seq", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("workspace_id", sa.String(32), sa.ForeignKey("workspaces.id"), nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    *_definition(),
    sa.Column("execution_message_description", sa.String(200)),
    sa.Column("enable_globally", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("disabled_reason", sa.Text),
    sa.Column("usage_count", sa.BigInteger, nullable=False),
    sa.Column("failure_count", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", Moment, nullable=False),
    sa.Column("updated_at", Moment, nullable=False),
    sa.UniqueConstraint("workspace_id", "name", name="uq_tools_workspace_name"),
    sa.Index("ix_tools_workspace_seq", "workspace_id", "seq"),  # a workspace's pages
)

tool_versions = sa.Table(
    "tool_versions",
    metadata,
    sa.Column("tool_id", sa.String(32), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    *_definition(),
    sa.Column("created_at", Moment, nullable=False),
)

audit = sa.Table(
    "audit",
    metadata,
    sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True
    ),
    sa.Column("workspace_id", sa.String(32), nullable=False),
    sa.Column("tool_call_id", sa.String(MAX_CALL_ID_CHARS)),
    sa.Column("tool_id", sa.String(32)),
    sa.Column("agent_id", sa.String(MAX_CALL_ID_CHARS)),
    sa.Column("source", sa.String(8), nullable=False),
    sa.Column("event", sa.String(80), nullable=False),
    sa.Column("data", JSONType, nullable=False),
    sa.Column("created_at", Moment, nullable=False),
    sa.Index("ix_audit_workspace", "workspace_id", "id"),
    sa.Index("ix_audit_tool", "tool_id", "id"),
    sa.Index("ix_audit_call", "tool_call_id"),
    sa.Index("ix_audit_event", "event", "id"),
)

tool_calls = sa.Table(
    "tool_calls",
    metadata,
    # A tool_call_id is the client's, so it is unique within a workspace only.
    sa.Column("workspace_id", sa.String(32), primary_key=True),
    sa.Column("id", sa.String(MAX_CALL_ID_CHARS), primary_key=True),
    sa.Column("tool_id", sa.String(32)),
    sa.Column("version", sa.Integer),
    sa.Column("kind", sa.String(16), nullable=False),  # invoke | program
    sa.Column("status", sa.String(8), nullable=False),
    sa.Column("error_code", sa.String(32)),
    sa.Column("result", JSONType, nullable=False),
    sa.Column("agent_id", sa.String(MAX_CALL_ID_CHARS)),
    sa.Column("created_at", Moment, nullable=False),
    sa.Index("ix_tool_calls_tool", "tool_id", "created_at"),
)

# A tool's calls per minute and outcome code ("" for ok), with a count per duration bucket
# (domain/stats.py): what GET /v1/custom-tools/{id}/stats reads, one row per minute and code.
tool_call_stats = sa.Table(
    "tool_call_stats",
    metadata,
    sa.Column("tool_id", sa.String(32), primary_key=True),
    sa.Column("minute", sa.Integer, primary_key=True),
    sa.Column("code", sa.String(32), primary_key=True),
    sa.Column("calls", sa.Integer, nullable=False),
    *(sa.Column(f"d{i}", sa.Integer, nullable=False) for i in range(STATS_BUCKETS)),
    sa.Index("ix_tool_call_stats_minute", "minute"),  # the pruning of old minutes
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("seq", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("workspace_id", sa.String(32), nullable=False),
    sa.Column("message_id", sa.String(255), nullable=False),
    sa.Column("recipients", JSONType, nullable=False),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("body_text", sa.Text, nullable=False),
    sa.Column("body_html", sa.Text),
    sa.Column("reply_to", sa.String(320)),
    sa.Column("source", sa.String(8), nullable=False),
    sa.Column("tool_call_id", sa.String(MAX_CALL_ID_CHARS)),
    sa.Column("created_at", Moment, nullable=False),
    sa.Index("ix_outbox_workspace_seq", "workspace_id", "seq"),  # a workspace's pages
)

files = sa.Table(
    "files",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("workspace_id", sa.String(32), nullable=False),
    sa.Column("filename", sa.String(255), nullable=False),
    sa.Column("mime_type", sa.String(127), nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("created_at", Moment, nullable=False),
    sa.Column("expires_at", Moment, nullable=False),
    # In the database, so every replica serves every link; null only on rows from before.
    sa.Column("content", sa.LargeBinary),
    sa.Index("ix_files_workspace_expires", "workspace_id", "expires_at"),  # a quota
    sa.Index("ix_files_expires", "expires_at"),  # the pruning of expired files
)

agents = sa.Table(
    "agents",
    metadata,
    sa.Column("seq", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("workspace_id", sa.String(32), sa.ForeignKey("workspaces.id"), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("created_at", Moment, nullable=False),
)

agent_tools = sa.Table(
    "agent_tools",
    metadata,
    sa.Column("agent_id", sa.String(32), primary_key=True),
    sa.Column("tool_id", sa.String(32), primary_key=True),
    sa.Column("version", sa.Integer),  # null: follow the tool's current version
    sa.Column("created_at", Moment, nullable=False),
)

# Secrets the service makes for itself (the file-link key when none is configured): one row
# each, the same for every replica on the database.
service_secrets = sa.Table(
    "service_secrets",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)

workspace_secrets = sa.Table(
    "workspace_secrets",
    metadata,
    sa.Column("workspace_id", sa.String(32), sa.ForeignKey("workspaces.id"), primary_key=True),
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("hosts", JSONType, nullable=False),
    sa.Column("sealed", sa.Text, nullable=False),  # the value, sealed (storage/sealing.py)
    sa.Column("created_at", Moment, nullable=False),
    sa.Column("updated_at", Moment, nullable=False),
    sa.Column("last_used_at", Moment),
)
