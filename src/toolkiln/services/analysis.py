"""Each text of tool code analysed once per workspace: a cache in front of the analyser.

Saving a tool, its test run, its test cases and every later call of its version need the
same ``Analysis``; the text is parsed once and the answer kept, by the text's hash, for the
workspace that sent it. Never across workspaces: how fast a text is answered would tell one
workspace what another has saved. An analysis that did not finish (over its time or memory)
is not kept. The cache holds at most ``entries`` analyses and ``chars`` characters of
scripts and names, least recently used out first.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from toolkiln.domain.analysis import Analysis
from toolkiln.services.ports import CodeAnalyser

ENTRIES = 4096
CHARS = 64 * 1024 * 1024

_Key = tuple[str, str, bytes]  # workspace, language, SHA-256 of the text


class CachedAnalyser:
    """A ``CodeAnalyser`` that asks ``inner`` once per (workspace, language, text)."""

    def __init__(self, inner: CodeAnalyser, entries: int = ENTRIES, chars: int = CHARS) -> None:
        self._inner = inner
        self._entries = entries
        self._chars = chars
        self._kept: OrderedDict[_Key, tuple[Analysis, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).digest()
        key = (workspace_id, language, digest)
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                return found[0]
        made = self._inner.analyse(language, code, workspace_id)
        if made.limit:
            return made
        size = 256 + len(made.script) + sum(len(n) for n in made.imports)
        with self._lock:
            if key not in self._kept:
                self._kept[key] = (made, size)
                self._size += size
            while self._kept and (len(self._kept) > self._entries or self._size > self._chars):
                self._size -= self._kept.popitem(last=False)[1][1]
        return made
