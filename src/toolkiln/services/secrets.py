"""Workspace secrets: create, list, change, delete; and what ``http_request`` reads of them.

A value is sealed before it reaches the repository and opened only for a request that names
it; no answer, audit row or log line holds one (tests/egress/test_secrets_never_shown.py).
"""

from __future__ import annotations

from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict, InvalidRequest, NotFound
from toolkiln.domain.ids import utcnow
from toolkiln.domain.records import AuditRow
from toolkiln.domain.secrets import (
    MAX_SECRETS,
    Secret,
    SecretInfo,
    check_hosts,
    check_name,
    check_value,
    rules,
)
from toolkiln.services.ports import Sealer, UnitOfWork, UnitOfWorkFactory


def _context(workspace_id: str, name: str) -> str:
    return f"{workspace_id}/{name}"


class SecretService:
    def __init__(self, uow: UnitOfWorkFactory, sealer: Sealer) -> None:
        self._uow = uow
        self._sealer = sealer

    def create(
        self, principal: Principal, workspace_id: str, name: str, value: str, hosts: list[str]
    ) -> SecretInfo:
        principal.require("write")
        principal.require_workspace(workspace_id)
        problems = check_name(name) + check_value(value) + check_hosts(hosts)
        if problems:
            raise InvalidRequest("The secret is not valid.", problems)
        now = utcnow()
        info = SecretInfo(name, list(hosts), now, now)
        sealed = self._sealer.seal(value, _context(workspace_id, name))
        with self._uow() as tx:
            self._require_workspace(tx, workspace_id)
            if tx.secrets.get(workspace_id, name) is not None:
                raise _taken(name)
            if tx.secrets.count(workspace_id) >= MAX_SECRETS:
                raise InvalidRequest(
                    f"A workspace holds at most {MAX_SECRETS} secrets.",
                    [{"field": "name", "message": f"at most {MAX_SECRETS} secrets"}],
                )
            tx.secrets.add(workspace_id, info, sealed)
            _audit(tx, workspace_id, "secret.created", {"name": name, "hosts": info.hosts})
        return info

    def all(self, principal: Principal, workspace_id: str) -> list[SecretInfo]:
        principal.require("read")
        principal.require_workspace(workspace_id)
        with self._uow(readonly=True) as tx:
            self._require_workspace(tx, workspace_id)
            return tx.secrets.all(workspace_id)

    def update(
        self, principal: Principal, workspace_id: str, name: str, change: dict[str, Any]
    ) -> SecretInfo:
        """``change`` holds ``value``, ``hosts`` or both."""
        principal.require("write")
        principal.require_workspace(workspace_id)
        if check_name(name):  # no such secret (a NUL, which PostgreSQL cannot compare)
            raise NotFound("No secret of that name in this workspace.")
        problems = []
        if "value" in change:
            problems += check_value(change["value"])
        if "hosts" in change:
            problems += check_hosts(change["hosts"])
        if problems:
            raise InvalidRequest("The secret is not valid.", problems)
        fields: dict[str, Any] = {"updated_at": utcnow()}
        if "value" in change:
            fields["sealed"] = self._sealer.seal(change["value"], _context(workspace_id, name))
        if "hosts" in change:
            fields["hosts"] = list(change["hosts"])
        with self._uow() as tx:
            if tx.secrets.get(workspace_id, name) is None:
                raise NotFound("No secret of that name in this workspace.")
            tx.secrets.update(workspace_id, name, fields)
            shown = {"name": name, "changed": sorted(k for k in change if k in ("value", "hosts"))}
            _audit(tx, workspace_id, "secret.updated", shown)
            found = tx.secrets.get(workspace_id, name)
        assert found is not None
        return found[0]

    def delete(self, principal: Principal, workspace_id: str, name: str) -> None:
        principal.require("write")
        principal.require_workspace(workspace_id)
        if check_name(name):
            raise NotFound("No secret of that name in this workspace.")
        with self._uow() as tx:
            if not tx.secrets.delete(workspace_id, name):
                raise NotFound("No secret of that name in this workspace.")
            _audit(tx, workspace_id, "secret.deleted", {"name": name})

    # -- what http_request reads (services/ports.py: SecretSource)

    def for_request(self, workspace_id: str, names: list[str]) -> dict[str, Secret]:
        with self._uow(readonly=True) as tx:
            found = tx.secrets.sealed(workspace_id, names)
        return {
            name: Secret(
                name,
                self._sealer.open(sealed, _context(workspace_id, name)),
                rules(info.hosts),
            )
            for name, (info, sealed) in found.items()
        }

    def used(self, workspace_id: str, names: list[str]) -> None:
        with self._uow() as tx:
            tx.secrets.used(workspace_id, names)

    @staticmethod
    def _require_workspace(tx: UnitOfWork, workspace_id: str) -> None:
        if tx.workspaces.get(workspace_id) is None:
            raise NotFound("No workspace with that id.")


def _audit(tx: UnitOfWork, workspace_id: str, event: str, data: dict[str, Any]) -> None:
    tx.audit.add(AuditRow(workspace_id, event, data=data))


def _taken(name: str) -> Conflict:
    return Conflict(
        f"A secret named {name!r} exists in this workspace.",
        [{"field": "name", "message": "is taken in this workspace"}],
        code="name_taken",
    )
