"""The workspace secrets' repository: rows hold the value sealed, never in the clear."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from toolkiln.domain.errors import Conflict
from toolkiln.domain.ids import utcnow
from toolkiln.domain.secrets import SecretInfo
from toolkiln.storage.moments import utc as _utc
from toolkiln.storage.tables import workspace_secrets

_s = workspace_secrets.c


class SqlSecrets:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    @staticmethod
    def _info(r: RowMapping) -> SecretInfo:
        return SecretInfo(
            r["name"],
            list(r["hosts"]),
            _utc(r["created_at"]) or utcnow(),
            _utc(r["updated_at"]) or utcnow(),
            _utc(r["last_used_at"]),
        )

    def _where(self, workspace_id: str, name: str) -> sa.ColumnElement[bool]:
        return (_s.workspace_id == workspace_id) & (_s.name == name)

    def add(self, workspace_id: str, info: SecretInfo, sealed: str) -> None:
        values = {
            "workspace_id": workspace_id,
            "name": info.name,
            "hosts": info.hosts,
            "sealed": sealed,
            "created_at": info.created_at,
            "updated_at": info.updated_at,
        }
        try:  # two creates of one name meet the key
            with self._c.begin_nested():
                self._c.execute(workspace_secrets.insert().values(**values))
        except sa.exc.IntegrityError as exc:
            raise Conflict("A secret with that name exists.", code="name_taken") from exc

    def get(self, workspace_id: str, name: str) -> tuple[SecretInfo, str] | None:
        q = workspace_secrets.select().where(self._where(workspace_id, name))
        row = self._c.execute(q).mappings().first()
        return (self._info(row), row["sealed"]) if row else None

    def all(self, workspace_id: str) -> list[SecretInfo]:
        q = workspace_secrets.select().where(_s.workspace_id == workspace_id).order_by(_s.name)
        return [self._info(r) for r in self._c.execute(q).mappings()]

    def sealed(self, workspace_id: str, names: list[str]) -> dict[str, tuple[SecretInfo, str]]:
        q = workspace_secrets.select().where(_s.workspace_id == workspace_id, _s.name.in_(names))
        return {r["name"]: (self._info(r), r["sealed"]) for r in self._c.execute(q).mappings()}

    def update(self, workspace_id: str, name: str, fields: dict[str, Any]) -> None:
        q = workspace_secrets.update().where(self._where(workspace_id, name)).values(**fields)
        self._c.execute(q)

    def used(self, workspace_id: str, names: list[str]) -> None:
        q = (
            workspace_secrets.update()
            .where(_s.workspace_id == workspace_id, _s.name.in_(names))
            .values(last_used_at=utcnow())
        )
        self._c.execute(q)

    def delete(self, workspace_id: str, name: str) -> bool:
        q = workspace_secrets.delete().where(self._where(workspace_id, name))
        return bool(self._c.execute(q).rowcount)

    def count(self, workspace_id: str) -> int:
        q = sa.select(sa.func.count()).where(_s.workspace_id == workspace_id)
        return int(self._c.execute(q).scalar() or 0)
