"""Places for long work: what one workspace, and all of them, may have under way at once.

Long work is what holds a model, the sandbox or a thread for seconds: a generation (its
model requests and example runs), a set of test cases (on create, on PATCH, ``run-tests``),
a test run (``/test``), ``run_code`` and ``run_program`` called at the root (REST, an
agent's tool call, MCP). Each takes one place for as long as it runs; the calls nested
under it take none (they spend its budget). A workspace holding ``per_workspace`` places,
or a service holding ``total``, is refused at once with ``TooManyRequests`` (429 and
``Retry-After``): nobody queues, so no workspace's long work can pile up behind another's
and no thread waits for a place.

The places are this process's: with several replicas, each bounds its own.
``tests/security/test_slow_work.py`` guards it.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from toolkiln.domain.errors import TooManyRequests

Kind = Literal["generation", "test_cases", "test_run", "run_code", "program"]

PER_WORKSPACE = 4
TOTAL = 16
RETRY_AFTER_S = 5


@dataclass(frozen=True, slots=True)
class PlacesConfig:
    per_workspace: int = PER_WORKSPACE
    total: int = TOTAL
    retry_after_s: int = RETRY_AFTER_S


class Place:
    """One place held; given back once (``release``, or the end of a ``with`` block)."""

    __slots__ = ("_places", "kind", "workspace_id")

    def __init__(self, places: Places, workspace_id: str, kind: Kind) -> None:
        self._places: Places | None = places
        self.workspace_id = workspace_id
        self.kind = kind

    def release(self) -> None:
        places, self._places = self._places, None
        if places is not None:
            places._give_back(self.workspace_id)

    def __enter__(self) -> Place:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Places:
    """The one admission of long work; thread-safe, never waits."""

    def __init__(self, config: PlacesConfig | None = None) -> None:
        self.config = config or PlacesConfig()
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._total = 0

    def take(self, workspace_id: str, kind: Kind) -> Place:
        """A place for ``kind`` of work in ``workspace_id``, or ``TooManyRequests``."""
        cfg = self.config
        with self._lock:
            mine = self._held[workspace_id]
            if mine < cfg.per_workspace and self._total < cfg.total:
                self._held[workspace_id] = mine + 1
                self._total += 1
                return Place(self, workspace_id, kind)
            full = mine >= cfg.per_workspace
        if full:
            message = (
                f"This workspace has {cfg.per_workspace} long tasks (generations, test runs, "
                "programs) under way, its share; try again when one has ended."
            )
        else:
            message = "The service has all its places for long work in use; try again shortly."
        details = {
            "kind": kind,
            "limit": cfg.per_workspace if full else cfg.total,
            "scope": "workspace" if full else "service",
            "retry_after_s": cfg.retry_after_s,
        }
        raise TooManyRequests(message, details, retry_after_s=cfg.retry_after_s)

    def held(self, workspace_id: str | None = None) -> int:
        """Places in use: by one workspace, or in all."""
        with self._lock:
            return self._total if workspace_id is None else self._held[workspace_id]

    def _give_back(self, workspace_id: str) -> None:
        with self._lock:
            left = self._held[workspace_id] - 1
            if left > 0:
                self._held[workspace_id] = left
            else:
                del self._held[workspace_id]
            self._total -= 1
