"""Readiness: is the database reachable, can a runner take calls, are the sandbox pools
ready, do background loops run.

``/healthz`` answers 503 while the database or a sandbox pool is not ready and says which and
why; a background loop that keeps failing is reported as degraded without failing readiness
(the service still serves; only MCP list-change notices may be late).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkiln.domain.execution import unavailable_runtime

# Runner states in which a runner takes calls (runners/client.py).
TAKING = ("serving", "degraded")


class SystemService:
    def __init__(
        self,
        db_problem: Callable[[], str | None],
        runtimes: Callable[[], dict[str, Any]] = dict,
        background: Callable[[], dict[str, Any]] = dict,
        runners: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._db_problem = db_problem
        self._runtimes = runtimes
        self._background = background
        self._runners = runners

    def health(self) -> tuple[bool, dict[str, Any]]:
        db_problem = self._db_problem()
        runtimes = {
            name: {
                k: r[k]
                for k in ("available", "ready", "insecure", "isolation", "pool", "missing_layers")
                if k in r
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
        runners = self._runners() if self._runners is not None else None
        if runners is not None and not any(r["state"] in TAKING for r in runners):
            degraded.append({"part": "runners", "reason": "no runner can take a call"})
        ready = not degraded
        # Isolation layers the operator accepted the absence of (TOOLKILN_SANDBOX_ACCEPT):
        # listed as degraded, but the service is ready (it runs as it was told to).
        for name, r in runtimes.items():
            for missing in r.get("missing_layers") or []:
                part = f"runtime.{name}.layer.{missing['layer']}"
                degraded.append({"part": part, "reason": f"accepted absent: {missing['reason']}"})
        return ready, {
            "status": "ok" if ready else "unavailable",
            "database": "ok" if db_problem is None else "unreachable",
            "runners": runners,
            "runtimes": runtimes,
            "background": self._background(),
            "degraded": degraded,
        }

    def runners(self) -> list[dict[str, Any]]:
        """Each runner's address, state, places and load (none without runners)."""
        return self._runners() if self._runners is not None else []

    def runtimes(self) -> dict[str, Any]:
        """What each language offers, and that it is true."""
        found = self._runtimes()
        for language in ("python", "javascript"):
            found.setdefault(language, unavailable_runtime())
        return found
