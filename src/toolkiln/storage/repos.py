"""Repositories over one connection: the storage side of ``services.ports``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from toolkiln.domain.errors import Conflict
from toolkiln.domain.ids import utcnow
from toolkiln.domain.records import (
    LIST_CHANGING_EVENTS,
    Agent,
    AuditFilter,
    AuditRow,
    CallRecord,
    CountResult,
    Policy,
    TokenRecord,
    Workspace,
)
from toolkiln.domain.tools import (
    AUTO_DISABLE_AFTER,
    AUTO_DISABLE_REASON,
    VERSIONED_FIELDS,
    Definition,
    Tool,
    ToolVersion,
)
from toolkiln.storage.files_repo import SqlFiles
from toolkiln.storage.lists_repo import SqlLists
from toolkiln.storage.moments import utc as _utc
from toolkiln.storage.prepared import Prepared
from toolkiln.storage.secrets_repo import SqlSecrets
from toolkiln.storage.stats_repo import SqlStats
from toolkiln.storage.tables import (
    agent_tools,
    agents,
    audit,
    outbox,
    tokens,
    tool_calls,
    tool_versions,
    tools,
    workspaces,
)


def _after(column: sa.Column[Any], seq: int) -> sa.ColumnElement[bool]:
    """``column > seq`` for any position a cursor holds (64 bits, domain/opaque.py): past
    what the column's type holds no row follows it (PostgreSQL answered a 32-bit ``seq``
    column's "integer out of range" with a 500)."""
    top = 2**63 - 1 if isinstance(column.type, sa.BigInteger) else 2**31 - 1
    return column > min(seq, top)


class SqlWorkspaces:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    @staticmethod
    def _row(r: RowMapping) -> Workspace:
        return Workspace(r["id"], r["name"], _utc(r["created_at"]) or utcnow())

    def add(self, workspace: Workspace, policy: Policy) -> None:
        values = {
            "id": workspace.id,
            "name": workspace.name,
            "policy": policy.as_dict(),
            "created_at": workspace.created_at,
        }
        try:  # requests that passed the name check together meet the key (PostgreSQL)
            with self._c.begin_nested():
                self._c.execute(workspaces.insert().values(**values))
        except sa.exc.IntegrityError as exc:
            raise Conflict("A workspace with that name exists.", code="name_taken") from exc

    def get(self, workspace_id: str) -> Workspace | None:
        r = self._c.execute(workspaces.select().where(workspaces.c.id == workspace_id)).mappings()
        row = r.first()
        return self._row(row) if row else None

    def get_by_name(self, name: str) -> Workspace | None:
        r = self._c.execute(workspaces.select().where(workspaces.c.name == name)).mappings()
        row = r.first()
        return self._row(row) if row else None

    def all(self, only_id: str | None = None) -> list[Workspace]:
        q = workspaces.select().order_by(workspaces.c.created_at, workspaces.c.id)
        if only_id is not None:
            q = q.where(workspaces.c.id == only_id)
        return [self._row(r) for r in self._c.execute(q).mappings()]

    def policy(self, workspace_id: str) -> Policy:
        row = _POLICY.first(self._c, {"id": workspace_id})  # read by every invoke
        return Policy.from_dict(row["policy"] if row is not None else None)

    def set_policy(self, workspace_id: str, policy: Policy) -> None:
        self._c.execute(
            workspaces.update()
            .where(workspaces.c.id == workspace_id)
            .values(policy=policy.as_dict())
        )


class SqlTokens:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    @staticmethod
    def _row(r: RowMapping | Mapping[str, Any]) -> TokenRecord:
        return TokenRecord(
            r["id"],
            r["workspace_id"],
            frozenset(r["scopes"].split(",")),
            r["name"],
            r["token_hash"],
            _utc(r["created_at"]) or utcnow(),
            _utc(r["revoked_at"]),
        )

    def add(self, token: TokenRecord) -> None:
        self._c.execute(
            tokens.insert().values(
                id=token.id,
                workspace_id=token.workspace_id,
                token_hash=token.token_hash,
                scopes=",".join(sorted(token.scopes)),
                name=token.name,
                created_at=token.created_at,
            )
        )

    def get(self, token_id: str) -> TokenRecord | None:
        row = self._c.execute(tokens.select().where(tokens.c.id == token_id)).mappings().first()
        return self._row(row) if row else None

    def by_hash(self, token_hash: str) -> TokenRecord | None:
        row = _TOKEN_BY_HASH.first(self._c, {"h": token_hash})
        return self._row(row) if row else None

    def all(self, workspace_id: str | None) -> list[TokenRecord]:
        q = tokens.select().order_by(tokens.c.created_at, tokens.c.id)
        if workspace_id is not None:
            q = q.where(tokens.c.workspace_id == workspace_id)
        return [self._row(r) for r in self._c.execute(q).mappings()]

    def revoke(self, token_id: str) -> None:
        self._c.execute(tokens.update().where(tokens.c.id == token_id).values(revoked_at=utcnow()))

    def any_admin(self) -> bool:
        q = sa.select(tokens.c.scopes).where(tokens.c.revoked_at.is_(None))
        return any("admin" in s.split(",") for s in self._c.execute(q).scalars())

    def active_admin_ids(self) -> list[str]:
        # FOR UPDATE (PostgreSQL; SQLite writers are serialised by BEGIN IMMEDIATE): two
        # revocations racing for the last two admin tokens cannot both see the other alive.
        q = (
            sa.select(tokens.c.id, tokens.c.scopes)
            .where(tokens.c.revoked_at.is_(None))
            .with_for_update()
        )
        return [r.id for r in self._c.execute(q) if "admin" in r.scopes.split(",")]


_TOOL_FIELDS = [c.name for c in tools.columns if c.name not in VERSIONED_FIELDS]


class SqlTools:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    @staticmethod
    def _row(r: RowMapping | Mapping[str, Any]) -> Tool:
        values = {k: r[k] for k in _TOOL_FIELDS}
        values["created_at"] = _utc(values["created_at"])
        values["updated_at"] = _utc(values["updated_at"])
        return Tool(definition=Definition.of(r), **values)

    def add(self, tool: Tool) -> None:
        values = {k: getattr(tool, k) for k in _TOOL_FIELDS if k != "seq"}
        values.update(tool.definition.as_dict())
        try:
            with self._c.begin_nested():
                self._c.execute(tools.insert().values(**values))
        except sa.exc.IntegrityError as exc:
            raise Conflict("A tool with that name exists.", code="name_taken") from exc

    def get(self, tool_id: str, *, for_update: bool = False) -> Tool | None:
        if for_update:  # the row locked until the transaction ends (PostgreSQL; SQLite's
            # write transactions are one at a time already)
            q = tools.select().where(tools.c.id == tool_id).with_for_update()
            locked = self._c.execute(q).mappings().first()
            return self._row(locked) if locked else None
        row = _TOOL_BY_ID.first(self._c, {"id": tool_id})
        return self._row(row) if row else None

    def get_as(
        self, token_hash: str, tool_id: str
    ) -> tuple[TokenRecord, Tool | None, Policy | None] | None:
        """What an invocation reads, in one statement: the token with that hash (None: no
        such token), the tool with that id and its workspace's policy (None, None: no such
        tool). Whether the token may reach the tool is the caller's to decide."""
        row = _TOOL_AS.first(self._c, {"h": token_hash, "id": tool_id})
        if row is None:
            return None
        token = SqlTokens._row({k[3:]: v for k, v in row.items() if k.startswith("tk_")})
        if row["tl_id"] is None:
            return token, None, None
        tool = self._row({k[3:]: v for k, v in row.items() if k.startswith("tl_")})
        return token, tool, Policy.from_dict(row["ws_policy"])

    def status(self, tool_id: str) -> str | None:
        row = _TOOL_STATUS.first(self._c, {"id": tool_id})
        return row["status"] if row is not None else None

    def by_name(self, workspace_id: str, name: str) -> Tool | None:
        q = tools.select().where(tools.c.workspace_id == workspace_id, tools.c.name == name)
        row = self._c.execute(q).mappings().first()
        return self._row(row) if row else None

    def offered(self, workspace_id: str, agent_id: str) -> list[tuple[Tool, int | None]]:
        """Active tools of the workspace that are global or enabled for the agent, by name,
        each with the version the agent pinned it at (None: none): one statement."""
        params = {"ws": workspace_id, "agent": agent_id}
        return [(self._row(r), r["pinned"]) for r in self._c.execute(_OFFERED, params).mappings()]

    def name_taken(self, workspace_id: str, name: str, except_id: str | None = None) -> bool:
        q = sa.select(tools.c.id).where(tools.c.workspace_id == workspace_id, tools.c.name == name)
        if except_id is not None:
            q = q.where(tools.c.id != except_id)
        return self._c.execute(q).first() is not None

    def page(self, workspace_id: str | None, after_seq: int, limit: int) -> list[Tool]:
        q = tools.select().where(_after(tools.c.seq, after_seq)).order_by(tools.c.seq).limit(limit)
        if workspace_id is not None:
            q = q.where(tools.c.workspace_id == workspace_id)
        return [self._row(r) for r in self._c.execute(q).mappings()]

    def update(self, tool_id: str, fields: dict[str, Any]) -> None:
        try:
            with self._c.begin_nested():
                self._c.execute(tools.update().where(tools.c.id == tool_id).values(**fields))
        except sa.exc.IntegrityError as exc:
            raise Conflict("A tool with that name exists.", code="name_taken") from exc

    def delete(self, tool_id: str) -> None:
        self._c.execute(tool_versions.delete().where(tool_versions.c.tool_id == tool_id))
        self._c.execute(tools.delete().where(tools.c.id == tool_id))

    def add_version(self, version: ToolVersion) -> None:
        self._c.execute(
            tool_versions.insert().values(
                tool_id=version.tool_id,
                version=version.version,
                created_at=version.created_at,
                **version.definition.as_dict(),
            )
        )

    @staticmethod
    def _version(r: RowMapping) -> ToolVersion:
        created = _utc(r["created_at"]) or utcnow()
        return ToolVersion(r["tool_id"], r["version"], Definition.of(r), created)

    def versions(self, tool_id: str) -> list[ToolVersion]:
        q = tool_versions.select().where(tool_versions.c.tool_id == tool_id)
        return [
            self._version(r)
            for r in self._c.execute(q.order_by(tool_versions.c.version)).mappings()
        ]

    def version(self, tool_id: str, number: int) -> ToolVersion | None:
        q = tool_versions.select().where(
            tool_versions.c.tool_id == tool_id, tool_versions.c.version == number
        )
        row = self._c.execute(q).mappings().first()
        return self._version(row) if row else None

    def count_outcome(self, tool_id: str, failed: bool, last_error: str | None) -> CountResult:
        """One atomic UPDATE, right under concurrency and across replicas on one database.

        Only an active tool's failure count moves (a late success or failure on a tool that
        was disabled meanwhile adds usage only), and right-hand column references see the
        row before the update: so exactly one update takes an active tool to disabled, and
        it is the one that reports ``just_disabled``.
        """
        key = {"b_id": tool_id}
        if failed:
            row = _COUNT_FAILURE.first(self._c, {**key, "b_last_error": last_error})
        else:
            row = _COUNT_SUCCESS.first(self._c, key)
        if row is not None:
            just = failed and row["status"] == "disabled"
            return CountResult(True, row["failure_count"], row["status"], just)
        row = _COUNT_USAGE.first(self._c, key)
        if row is None:
            return CountResult(False, 0, "active", False)
        return CountResult(True, row["failure_count"], row["status"], False)


# The statements every invocation runs, compiled once and run on the driver's cursor
# (storage/prepared.py).
_t = tools.c
_ACTIVE = (_t.id == sa.bindparam("b_id")) & (_t.status == "active")
_REACHES = _t.failure_count + 1 >= AUTO_DISABLE_AFTER
_COUNT_SUCCESS = Prepared(
    tools.update()
    .where(_ACTIVE)
    .values(usage_count=_t.usage_count + 1, failure_count=0)
    .returning(_t.failure_count, _t.status)
)
_COUNT_FAILURE = Prepared(
    tools.update()
    .where(_ACTIVE)
    .values(
        usage_count=_t.usage_count + 1,
        failure_count=_t.failure_count + 1,
        last_error=sa.bindparam("b_last_error"),
        disabled_reason=sa.case((_REACHES, AUTO_DISABLE_REASON), else_=_t.disabled_reason),
        status=sa.case((_REACHES, "disabled"), else_=_t.status),
    )
    .returning(_t.failure_count, _t.status)
)
_COUNT_USAGE = Prepared(
    tools.update()
    .where(_t.id == sa.bindparam("b_id"))
    .values(usage_count=_t.usage_count + 1)
    .returning(_t.failure_count, _t.status)
)
_TOOL_BY_ID = Prepared(tools.select().where(_t.id == sa.bindparam("id")))
_TOKEN_BY_HASH = Prepared(tokens.select().where(tokens.c.token_hash == sa.bindparam("h")))
# An invocation's read in one statement (one round trip on PostgreSQL instead of three): the
# token by its hash, the tool by its id (absent: NULLs) and its workspace's policy.
_TOOL_AS = Prepared(
    sa.select(
        *(c.label(f"tk_{c.key}") for c in tokens.c),
        *(c.label(f"tl_{c.key}") for c in tools.c),
        workspaces.c.policy.label("ws_policy"),
    )
    .select_from(
        tokens.outerjoin(tools, _t.id == sa.bindparam("id")).outerjoin(
            workspaces, workspaces.c.id == _t.workspace_id
        )
    )
    .where(tokens.c.token_hash == sa.bindparam("h"))
)
_TOOL_STATUS = Prepared(sa.select(_t.status).where(_t.id == sa.bindparam("id")))
# An agent's call and list read these: built once, so each run is a hit in SQLAlchemy's
# statement cache instead of a statement built and keyed anew.
_AGENT = agents.select().where(agents.c.id == sa.bindparam("id"))
_ENABLED_HERE = (agent_tools.c.tool_id == _t.id) & (agent_tools.c.agent_id == sa.bindparam("agent"))
_OFFERED = (
    sa.select(*tools.c, agent_tools.c.version.label("pinned"))
    .select_from(tools.outerjoin(agent_tools, _ENABLED_HERE))
    .where(
        _t.workspace_id == sa.bindparam("ws"),
        _t.status == "active",
        sa.or_(_t.enable_globally.is_(True), agent_tools.c.agent_id.is_not(None)),
    )
    .order_by(_t.name, _t.id)
)
_POLICY = Prepared(sa.select(workspaces.c.policy).where(workspaces.c.id == sa.bindparam("id")))
_CALL_EXISTS = Prepared(
    sa.select(tool_calls.c.id).where(
        tool_calls.c.workspace_id == sa.bindparam("ws"), tool_calls.c.id == sa.bindparam("id")
    )
)
_AUDIT_KEYS = (
    "workspace_id", "tool_call_id", "tool_id", "agent_id", "source", "event", "data", "created_at"
)  # fmt: skip
_AUDIT_INSERT = Prepared(audit.insert(), _AUDIT_KEYS)
_CALL_KEYS = (
    "id", "workspace_id", "tool_id", "version", "kind", "status", "error_code", "result",
    "agent_id", "created_at",
)  # fmt: skip
_CALL_INSERT = Prepared(tool_calls.insert(), _CALL_KEYS)


class SqlCalls:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    def add(self, call: CallRecord) -> None:
        # No savepoint on this hot path: the service checked the id, and a race that
        # slips past it becomes a Conflict in Database.transaction.
        _CALL_INSERT.run(
            self._c,
            {
                "id": call.id,
                "workspace_id": call.workspace_id,
                "tool_id": call.tool_id,
                "version": call.version,
                "kind": call.kind,
                "status": call.status,
                "error_code": call.error_code,
                "result": call.result,
                "agent_id": call.agent_id,
                "created_at": call.created_at,
            },
        )

    def exists(self, workspace_id: str, call_id: str) -> bool:
        params = {"ws": workspace_id, "id": call_id}
        return _CALL_EXISTS.first(self._c, params) is not None

    def get(self, workspace_id: str | None, call_id: str) -> CallRecord | None:
        """The call with that id in the workspace; ``None`` for the workspace: the newest
        call with that id in any workspace (for admin tokens)."""
        q = tool_calls.select().where(tool_calls.c.id == call_id)
        if workspace_id is not None:
            q = q.where(tool_calls.c.workspace_id == workspace_id)
        r = self._c.execute(q.order_by(tool_calls.c.created_at.desc())).mappings().first()
        if r is None:
            return None
        return CallRecord(
            r["id"], r["workspace_id"], r["tool_id"], r["version"], r["kind"], r["status"],
            r["error_code"], r["result"], r["agent_id"], _utc(r["created_at"]) or utcnow(),
        )  # fmt: skip


class SqlAudit:
    def __init__(self, conn: Connection) -> None:
        self._c = conn
        # The workspaces of the list-changing rows written: their list versions move at
        # commit (SqlUnitOfWork.before_commit).
        self.lists_changed: set[str] = set()

    @staticmethod
    def _params(row: AuditRow) -> dict[str, Any]:
        return {
            "workspace_id": row.workspace_id,
            "tool_call_id": row.tool_call_id,
            "tool_id": row.tool_id,
            "agent_id": row.agent_id,
            "source": row.source,
            "event": row.event,
            "data": row.data,
            "created_at": row.created_at or utcnow(),
        }

    def add(self, row: AuditRow) -> None:
        # A constant statement with parameters hits SQLAlchemy's compiled cache; building
        # insert().values(...) per row costs ~0.4 ms on the reference VM.
        _AUDIT_INSERT.run(self._c, self._params(row))
        if row.event in LIST_CHANGING_EVENTS:
            self.lists_changed.add(row.workspace_id)

    def add_many(self, rows: list[AuditRow]) -> None:
        _AUDIT_INSERT.run_many(self._c, [self._params(r) for r in rows])
        self.lists_changed.update(r.workspace_id for r in rows if r.event in LIST_CHANGING_EVENTS)

    def last_id(self, events: list[str]) -> int:
        """The newest row of these events (0 if none), by the (event, id) index."""
        q = sa.select(sa.func.max(audit.c.id)).where(audit.c.event.in_(events))
        return int(self._c.execute(q).scalar() or 0)

    def changes_after(self, events: list[str], after_id: int) -> list[tuple[int, str]]:
        """(id, workspace) of these events' rows with an id over ``after_id`` (the (event,
        id) index, one range per event)."""
        q = sa.select(audit.c.id, audit.c.workspace_id).where(
            audit.c.event.in_(events), audit.c.id > after_id
        )
        return [(int(i), str(w)) for i, w in self._c.execute(q)]

    def page(self, where: AuditFilter, after_id: int, limit: int) -> list[AuditRow]:
        q = audit.select().where(_after(audit.c.id, after_id)).order_by(audit.c.id).limit(limit)
        for name in ("workspace_id", "tool_id", "tool_call_id", "agent_id", "event"):
            value = getattr(where, name)
            if value is not None:
                q = q.where(audit.c[name] == value)
        return [
            AuditRow(
                workspace_id=r["workspace_id"],
                event=r["event"],
                source=r["source"],
                tool_id=r["tool_id"],
                tool_call_id=r["tool_call_id"],
                agent_id=r["agent_id"],
                data=r["data"],
                created_at=_utc(r["created_at"]),
                seq=r["id"],
            )
            for r in self._c.execute(q).mappings()
        ]


class SqlOutbox:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    def add(self, message: dict[str, Any]) -> None:
        self._c.execute(outbox.insert().values(**message))

    def page(self, workspace_id: str | None, after_seq: int, limit: int) -> list[dict[str, Any]]:
        q = (
            outbox.select()
            .where(_after(outbox.c.seq, after_seq))
            .order_by(outbox.c.seq)
            .limit(limit)
        )
        if workspace_id is not None:
            q = q.where(outbox.c.workspace_id == workspace_id)
        rows = []
        for r in self._c.execute(q).mappings():
            row = dict(r)
            row["created_at"] = _utc(row["created_at"])
            rows.append(row)
        return rows


class SqlAgents:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    @staticmethod
    def _row(r: RowMapping) -> Agent:
        return Agent(r["id"], r["workspace_id"], r["name"], _utc(r["created_at"]) or utcnow())

    def add(self, agent: Agent) -> None:
        self._c.execute(
            agents.insert().values(
                id=agent.id,
                workspace_id=agent.workspace_id,
                name=agent.name,
                created_at=agent.created_at,
            )
        )

    def get(self, agent_id: str) -> Agent | None:
        row = self._c.execute(_AGENT, {"id": agent_id}).mappings().first()
        return self._row(row) if row else None

    def all(self, workspace_id: str | None) -> list[Agent]:
        q = agents.select().order_by(agents.c.seq)
        if workspace_id is not None:
            q = q.where(agents.c.workspace_id == workspace_id)
        return [self._row(r) for r in self._c.execute(q).mappings()]

    def delete(self, agent_id: str) -> None:
        self._c.execute(agent_tools.delete().where(agent_tools.c.agent_id == agent_id))
        self._c.execute(agents.delete().where(agents.c.id == agent_id))

    def enable(self, agent_id: str, tool_id: str, version: int | None) -> None:
        """Insert or replace, idempotent under concurrency: two requests that both find no
        row (PostgreSQL, READ COMMITTED) both insert, and the later one, refused by the key,
        updates the row the earlier one committed instead of failing."""
        where = (agent_tools.c.agent_id == agent_id) & (agent_tools.c.tool_id == tool_id)
        values = {"version": version, "created_at": utcnow()}
        if self._c.execute(agent_tools.update().where(where).values(**values)).rowcount:
            return
        try:
            with self._c.begin_nested():
                self._c.execute(
                    agent_tools.insert().values(agent_id=agent_id, tool_id=tool_id, **values)
                )
        except sa.exc.IntegrityError:
            if not self._c.execute(agent_tools.update().where(where).values(**values)).rowcount:
                raise  # not the key (a tool deleted meanwhile): the transaction's Conflict

    def disable(self, agent_id: str, tool_id: str) -> bool:
        where = (agent_tools.c.agent_id == agent_id) & (agent_tools.c.tool_id == tool_id)
        return bool(self._c.execute(agent_tools.delete().where(where)).rowcount)

    def enabled(self, agent_id: str) -> dict[str, int | None]:
        q = sa.select(agent_tools.c.tool_id, agent_tools.c.version).where(
            agent_tools.c.agent_id == agent_id
        )
        return {r[0]: r[1] for r in self._c.execute(q)}


class SqlUnitOfWork:
    """The repositories of one transaction, and its connection (SQLAlchemy's, for what the
    repositories do not say: storage's own tests reach the driver and the server through it)."""

    def __init__(self, conn: Connection) -> None:
        self.connection = conn
        self.workspaces = SqlWorkspaces(conn)
        self.tokens = SqlTokens(conn)
        self.tools = SqlTools(conn)
        self.audit = SqlAudit(conn)
        self.calls = SqlCalls(conn)
        self.stats = SqlStats(conn)
        self.outbox = SqlOutbox(conn)
        self.files = SqlFiles(conn)
        self.agents = SqlAgents(conn)
        self.secrets = SqlSecrets(conn)
        self.lists = SqlLists(conn)

    def before_commit(self) -> None:
        """The writes a unit makes last, once its work succeeded: the list versions of the
        workspaces whose lists it changed."""
        if self.audit.lists_changed:
            self.lists.bump(self.audit.lists_changed)
