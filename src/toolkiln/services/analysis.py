"""Each text of tool code analysed once per workspace: a cache in front of the analyser.

Saving a tool, its test run, its test cases and every later call of its version need the
same ``Analysis``; the text is parsed once and the answer kept, by the text's hash, for the
workspace that sent it. Never across workspaces: how fast a text is answered would tell one
workspace what another has saved. An analysis that did not finish (over its time or memory)
is not kept. The cache holds at most ``entries`` analyses and ``chars`` characters of
scripts and names, least recently used out first; one workspace at most an eighth of each,
so that one workspace sending many texts only pushes out its own.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from toolkiln.domain.analysis import Analysis
from toolkiln.services.ports import CodeAnalyser

ENTRIES = 4096
CHARS = 64 * 1024 * 1024
SHARE = 8  # a workspace holds at most 1/SHARE of the entries and of the characters

_Key = tuple[str, str, bytes]  # workspace, language, SHA-256 of the text


class _Kept:
    """Kept analyses in least-recently-used order, and their size."""

    def __init__(self) -> None:
        self.order: OrderedDict[_Key, int] = OrderedDict()  # key -> size
        self.size = 0

    def add(self, key: _Key, size: int) -> None:
        self.order[key] = size
        self.size += size

    def drop(self, key: _Key) -> None:
        self.size -= self.order.pop(key)


class CachedAnalyser:
    """A ``CodeAnalyser`` that asks ``inner`` once per (workspace, language, text)."""

    def __init__(self, inner: CodeAnalyser, entries: int = ENTRIES, chars: int = CHARS) -> None:
        self._inner = inner
        self._entries = entries
        self._chars = chars
        self._found: dict[_Key, Analysis] = {}
        self._all = _Kept()
        self._of: dict[str, _Kept] = {}  # each workspace's
        self._lock = threading.Lock()

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).digest()
        key = (workspace_id, language, digest)
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._all.order.move_to_end(key)
                self._of[workspace_id].order.move_to_end(key)
                return found
        made = self._inner.analyse(language, code, workspace_id)
        if made.limit:
            return made
        size = 256 + len(made.script) + sum(len(n) for n in made.imports)
        with self._lock:
            if key not in self._found:
                self._found[key] = made
                self._all.add(key, size)
                self._of.setdefault(workspace_id, _Kept()).add(key, size)
            mine = self._of[workspace_id]
            while len(mine.order) * SHARE > self._entries or mine.size * SHARE > self._chars:
                self._drop(next(iter(mine.order)))
            while len(self._all.order) > self._entries or self._all.size > self._chars:
                self._drop(next(iter(self._all.order)))
        return made

    def _drop(self, key: _Key) -> None:
        del self._found[key]
        self._all.drop(key)
        mine = self._of[key[0]]
        mine.drop(key)
        if not mine.order:
            del self._of[key[0]]
