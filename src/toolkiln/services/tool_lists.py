"""Agents' rendered tool lists, kept in memory by their workspace's list version.

Rendering an agent's list reads every tool it offers and puts each schema in a provider's
shape: with 500 tools, milliseconds of work that only a change to a tool, an enablement or
the policy can alter. Each such change moves the workspace's list version in its own
transaction (storage/lists_repo.py), and a list request reads the version with the agent, so
a list is rendered once per version and served from here until the version moves, on every
replica alike (docs/decisions/170-tool-lists-cached-by-version.md).

Entries are held per workspace: a workspace's lists are found under its own id only, one
workspace holds at most a ``SHARE`` of the entries and bytes, and past a bound the least
recently used list of the workspace holding the most of it (entries or bytes) goes, so one
tenant's lists cannot push out another's that holds less (tests/services/test_tool_lists.py);
a list rendered twice at once is held and counted once
(tests/services/test_list_cache_twice.py).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 1024
MAX_BYTES = 64 * 1024 * 1024
SHARE = 4  # a workspace holds at most a quarter of the entries and of the bytes
# What a list's entries take in memory, per byte of their JSON (Python's dicts and strings
# are several times their text): the bytes bound counts both.
MEMORY_PER_JSON_BYTE = 4

# Which list: agent id, format, strict, mode, language, names.
Key = tuple[str, str, bool, str, str, str]


@dataclass(frozen=True, slots=True)
class Listing:
    """An agent's tool list in one format: its entries (shared by every request that is
    served them: read them, never change them) and the body the REST API answers with."""

    workspace_id: str
    entries: list[dict[str, Any]]
    body: bytes  # {"data": entries, "next_cursor": null}, as JSONResponse would encode it

    @classmethod
    def of(cls, workspace_id: str, entries: list[dict[str, Any]]) -> Listing:
        text = json.dumps(
            {"data": entries, "next_cursor": None},
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
        )
        return cls(workspace_id, entries, text.encode())

    @property
    def weight(self) -> int:
        return len(self.body) * (1 + MEMORY_PER_JSON_BYTE)


class _Held:
    """One workspace's lists, least recently used first, all of one list version."""

    __slots__ = ("bytes", "lists", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.lists: OrderedDict[Key, Listing] = OrderedDict()
        self.bytes = 0


class ListCache:
    """Rendered lists by (workspace, list version, which list); thread-safe."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self.entries = 0
        self.bytes = 0
        self.renders = 0  # lists rendered because none was held: for tests and benchmarks

    def get(self, workspace_id: str, version: int, key: Key) -> Listing | None:
        """The list held for this version, if any. A newer version drops every list held
        for the workspace (none of them can be served again)."""
        with self._lock:
            held = self._held.get(workspace_id)
            if held is None:
                return None
            if held.version != version:
                if held.version < version:
                    self._drop(workspace_id)
                return None
            found = held.lists.get(key)
            if found is not None:
                held.lists.move_to_end(key)
            return found

    def put(self, workspace_id: str, version: int, key: Key, listing: Listing) -> None:
        """Keep ``listing``, rendered from what was read at ``version`` or later."""
        with self._lock:
            self.renders += 1
            weight = listing.weight
            if weight > self._max_bytes // SHARE:
                return
            held = self._held.get(workspace_id)
            if held is not None and held.version > version:
                return  # a newer version is already held: this one is stale
            if held is not None and held.version < version:
                self._drop(workspace_id)
                held = None
            if held is None:
                held = self._held[workspace_id] = _Held(version)
            if key in held.lists:  # rendered twice at once: the later one is kept
                self._forget(workspace_id, key)
                held = self._held.setdefault(workspace_id, held)
            held.lists[key] = listing
            held.bytes += weight
            self.entries += 1
            self.bytes += weight
            while len(held.lists) > self._max_entries // SHARE or (
                held.bytes > self._max_bytes // SHARE
            ):
                self._forget(workspace_id, next(iter(held.lists)))
            while self.entries > self._max_entries or self.bytes > self._max_bytes:
                # the workspace holding the most of what is over its bound loses first
                by_entries = self.entries > self._max_entries
                fullest = max(
                    self._held,
                    key=lambda w: len(self._held[w].lists) if by_entries else self._held[w].bytes,
                )
                self._forget(fullest, next(iter(self._held[fullest].lists)))

    def _forget(self, workspace_id: str, key: Key) -> None:
        held = self._held[workspace_id]
        listing = held.lists.pop(key)
        held.bytes -= listing.weight
        self.entries -= 1
        self.bytes -= listing.weight
        if not held.lists:
            del self._held[workspace_id]

    def _drop(self, workspace_id: str) -> None:
        held = self._held.pop(workspace_id)
        self.entries -= len(held.lists)
        self.bytes -= held.bytes
