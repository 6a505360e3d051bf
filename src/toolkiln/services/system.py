"""Readiness: is the database reachable, and which sandbox layers are on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SystemService:
    def __init__(
        self,
        db_ping: Callable[[], bool],
        runtimes: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self._db_ping = db_ping
        self._runtimes = runtimes

    def health(self) -> tuple[bool, dict[str, Any]]:
        database = self._db_ping()
        runtimes = self._runtimes()
        ready = database and all(r.get("ready", False) for r in runtimes.values())
        return ready, {
            "status": "ok" if ready else "unavailable",
            "database": "ok" if database else "unreachable",
            "runtimes": runtimes,
        }
