"""Scopes, principals and the access rules every use case applies."""

from __future__ import annotations

from dataclasses import dataclass

from toolkiln.domain.errors import Forbidden, InvalidRequest, NotFound

SCOPES = ("read", "write", "invoke", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token bound to one workspace, or an admin token bound to all."""

    token_id: str
    workspace_id: str
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def require(self, scope: str) -> None:
        """Admin implies every other scope."""
        if scope not in self.scopes and not self.is_admin:
            raise Forbidden(f"This token lacks the '{scope}' scope.", {"required_scope": scope})

    def can_see(self, workspace_id: str) -> bool:
        return self.is_admin or workspace_id == self.workspace_id

    def require_workspace(self, workspace_id: str, what: str = "workspace") -> None:
        """Another workspace's object is reported as missing, never as forbidden."""
        if not self.can_see(workspace_id):
            raise NotFound(f"No {what} with that id.")


@dataclass(frozen=True, slots=True)
class Bearer:
    """A request's bearer token, not yet checked: a use case that reads the database anyway
    checks it in the same transaction (``services.access.principal_of``)."""

    value: str | None


def parse_scopes(raw: list[str] | str) -> frozenset[str]:
    items = raw.split(",") if isinstance(raw, str) else raw
    scopes = frozenset(s.strip() for s in items if s.strip())
    unknown = sorted(scopes - set(SCOPES))
    if unknown or not scopes:
        raise InvalidRequest(
            f"Scopes must be a non-empty subset of {', '.join(SCOPES)}.",
            [{"field": "scopes", "message": f"unknown scopes: {unknown}" if unknown else "empty"}],
        )
    return scopes
