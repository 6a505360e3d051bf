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
        runtimes = {
            name: {k: r[k] for k in ("available", "ready", "insecure", "isolation") if k in r}
            for name, r in self._runtimes().items()
        }
        ready = database and all(
            r.get("ready", False) for r in runtimes.values() if r.get("available", True)
        )
        return ready, {
            "status": "ok" if ready else "unavailable",
            "database": "ok" if database else "unreachable",
            "runtimes": runtimes,
        }

    def runtimes(self) -> dict[str, Any]:
        """CONTRACT section 3: what each language offers, and that it is true."""
        found = self._runtimes()
        for language in ("python", "javascript"):
            found.setdefault(
                language,
                {
                    "available": False,
                    "ready": False,
                    "entrypoints": [],
                    "return_contract": "",
                    "ctx": [],
                    "limits": {},
                    "isolation": {},
                    "dependencies": [],
                },
            )
        return found
