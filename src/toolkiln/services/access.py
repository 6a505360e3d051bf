"""Workspaces, tokens, policies and authentication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkiln.domain.auth import Principal, parse_scopes
from toolkiln.domain.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from toolkiln.domain.ids import hash_token, new_id, new_token_secret, utcnow
from toolkiln.domain.records import (
    AuditRow,
    Policy,
    TokenRecord,
    Workspace,
    check_label,
    check_policy,
)
from toolkiln.services.ports import UnitOfWork, UnitOfWorkFactory

DEFAULT_WORKSPACE = "default"


def principal_of(tx: UnitOfWork, bearer: str | None) -> Principal:
    """Who a bearer token is, read in the caller's transaction: the one rule for checking a
    token (revocation takes effect at the next request, on every replica)."""
    return principal_from(tx.tokens.by_hash(hash_of(bearer)))


def hash_of(bearer: str | None) -> str:
    """The stored hash a bearer token is looked up by; no token is 401 before any read."""
    if not bearer:
        raise Unauthenticated("A bearer token is required.")
    return hash_token(bearer)


def principal_from(record: TokenRecord | None) -> Principal:
    """The principal of the token record found by ``hash_of`` (None: none found)."""
    if record is None or record.revoked_at is not None:
        raise Unauthenticated("The token is unknown or revoked.")
    return Principal(record.id, record.workspace_id, record.scopes)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token record together with its secret value, which exists only in this answer."""

    record: TokenRecord
    value: str


class AccessService:
    """Who may do what: tokens, workspaces and their policies."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    # -- authentication

    def authenticate(self, bearer: str | None) -> Principal:
        if not bearer:
            raise Unauthenticated("A bearer token is required.")
        with self._uow(readonly=True) as tx:
            return principal_of(tx, bearer)

    # -- workspaces

    def create_workspace(self, principal: Principal | None, name: str) -> Workspace:
        if principal is not None:
            principal.require("admin")
        problems = check_label("name", name)
        if problems:
            raise InvalidRequest("The workspace name is not valid.", problems)
        with self._uow() as tx:
            return self._create_workspace(tx, name)

    @staticmethod
    def _create_workspace(tx: UnitOfWork, name: str) -> Workspace:
        if tx.workspaces.get_by_name(name) is not None:
            raise Conflict("A workspace with that name exists.", code="name_taken")
        workspace = Workspace(new_id(), name, utcnow())
        tx.workspaces.add(workspace, Policy())
        return workspace

    def list_workspaces(self, principal: Principal) -> list[Workspace]:
        principal.require("read")
        with self._uow(readonly=True) as tx:
            return tx.workspaces.all(None if principal.is_admin else principal.workspace_id)

    def get_workspace(self, principal: Principal, workspace_id: str) -> Workspace:
        principal.require("read")
        return self._existing(principal, workspace_id)

    def _existing(self, principal: Principal, workspace_id: str) -> Workspace:
        principal.require_workspace(workspace_id)
        with self._uow() as tx:
            workspace = tx.workspaces.get(workspace_id)
        if workspace is None:
            raise NotFound("No workspace with that id.")
        return workspace

    def resolve_workspace(self, ref: str) -> Workspace:
        """A workspace by id or name, for the local CLI."""
        with self._uow() as tx:
            found = tx.workspaces.get(ref) or tx.workspaces.get_by_name(ref)
        if found is None:
            raise NotFound(f"No workspace with id or name {ref!r}.")
        return found

    def resolve_all(self) -> list[Workspace]:
        """Every workspace, for the local CLI."""
        with self._uow() as tx:
            return tx.workspaces.all()

    def all_tokens(self, workspace_id: str | None) -> list[TokenRecord]:
        """Token records (never values), for the local CLI."""
        with self._uow() as tx:
            return tx.tokens.all(workspace_id)

    def get_policy(self, principal: Principal, workspace_id: str) -> Policy:
        self.get_workspace(principal, workspace_id)
        with self._uow() as tx:
            return tx.workspaces.policy(workspace_id)

    def patch_policy(
        self, principal: Principal, workspace_id: str, change: dict[str, Any]
    ) -> Policy:
        if not principal.is_admin:
            principal.require("write")
        self._existing(principal, workspace_id)
        with self._uow() as tx:
            merged = {**tx.workspaces.policy(workspace_id).as_dict(), **change}
            policy = Policy.from_dict(merged)
            problems = check_policy(policy)
            if problems:
                raise InvalidRequest("The policy is not valid.", problems)
            tx.workspaces.set_policy(workspace_id, policy)
            tx.audit.add(
                AuditRow(workspace_id, "workspace.policy_updated", data={"changed": sorted(change)})
            )
            return policy

    # -- tokens

    def create_token(
        self,
        principal: Principal | None,
        workspace_id: str,
        scopes: list[str] | str,
        name: str | None = None,
        value: str | None = None,
    ) -> IssuedToken:
        """``principal`` None means the local CLI, which acts with the data directory's rights."""
        if principal is not None:
            principal.require("admin")
        parsed = parse_scopes(scopes)
        problems = check_label("name", name, required=False)
        if problems:
            raise InvalidRequest("The token name is not valid.", problems)
        secret = value or new_token_secret()
        with self._uow() as tx:
            if tx.workspaces.get(workspace_id) is None:
                raise NotFound("No workspace with that id.")
            record = TokenRecord(new_id(), workspace_id, parsed, name, hash_token(secret), utcnow())
            tx.tokens.add(record)
        return IssuedToken(record, secret)

    def list_tokens(self, principal: Principal, workspace_id: str | None) -> list[TokenRecord]:
        principal.require("admin")
        with self._uow() as tx:
            return tx.tokens.all(workspace_id)

    def revoke_token(self, principal: Principal | None, token_id: str) -> None:
        if principal is not None:
            principal.require("admin")
        with self._uow() as tx:
            record = tx.tokens.get(token_id)
            if record is None or record.revoked_at is not None:
                raise NotFound("No active token with that id.")
            if "admin" in record.scopes and tx.tokens.active_admin_ids() == [token_id]:
                raise Conflict(
                    "This is the last admin token; create another admin token first.",
                    [{"field": "token_id", "message": "is the last active admin token"}],
                    code="last_admin_token",
                )
            tx.tokens.revoke(token_id)

    # -- first start

    def bootstrap(self, value: str | None) -> IssuedToken | None:
        """Create workspace ``default`` and an admin token if no admin token exists yet.

        Replicas started together on a new database race here; the one that loses (its
        ``default`` workspace clashes) looks again and finds the winner's admin token.
        """
        try:
            return self._bootstrap(value)
        except Conflict:
            return self._bootstrap(value)

    def _bootstrap(self, value: str | None) -> IssuedToken | None:
        with self._uow() as tx:
            if tx.tokens.any_admin():
                return None
            workspace = tx.workspaces.get_by_name(DEFAULT_WORKSPACE) or self._create_workspace(
                tx, DEFAULT_WORKSPACE
            )
            secret = value or new_token_secret()
            record = TokenRecord(
                new_id(),
                workspace.id,
                frozenset({"read", "write", "invoke", "admin"}),
                "bootstrap admin",
                hash_token(secret),
                utcnow(),
            )
            tx.tokens.add(record)
        return IssuedToken(record, secret)
