"""Readiness: is the database reachable, are the sandbox pools ready, do background loops run.

``/healthz`` answers 503 while the database or a sandbox pool is not ready and says which and
why; a background loop that keeps failing is reported as degraded without failing readiness
(the service still serves; only MCP list-change notices may be late).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SystemService:
    def __init__(
        self,
        db_problem: Callable[[], str | None],
        runtimes: Callable[[], dict[str, Any]] = dict,
        background: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self._db_problem = db_problem
        self._runtimes = runtimes
        self._background = background

    def health(self) -> tuple[bool, dict[str, Any]]:
        db_problem = self._db_problem()
        runtimes = {
            name: {
                k: r[k] for k in ("available", "ready", "insecure", "isolation", "pool") if k in r
            }
            for name, r in self._runtimes().items()
        }
        degraded: list[dict[str, str]] = []
        if db_problem is not None:
            degraded.append({"part": "database", "reason": db_problem})
        for name, r in runtimes.items():
            pool = r.get("pool") or {}
            if r.get("available", True) and (not r.get("ready", False) or pool.get("degraded")):
                why = pool.get("reason") or "the sandbox pool is not ready"
                degraded.append({"part": f"runtime.{name}", "reason": str(why)})
        ready = not degraded
        return ready, {
            "status": "ok" if ready else "unavailable",
            "database": "ok" if db_problem is None else "unreachable",
            "runtimes": runtimes,
            "background": self._background(),
            "degraded": degraded,
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
