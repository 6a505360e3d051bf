"""Python tool code compiled once, not per call.

A Python child serves one call, so each call compiled its tool's source again: for a tool of
~90 lines that was ~1.6 ms of the call (docs/decisions/106-compiled-code-per-workspace.md), more
than the rest of the sandbox's part. Code seen twice in a workspace is compiled once more, by a
sandbox child of its own that is given the source and nothing else (no input, no context, no ctx
link: no call's data can reach what it returns), and later calls of that code in that workspace are
sent the compiled code (marshal bytes, base64) beside the source; the child loads it instead
of compiling, and compiles the source itself when the bytes do not load as the tool's code.

What is kept is a function of the source alone and stays in its workspace: the key is the
workspace and the source's SHA-256, so identical code in two workspaces is compiled for each.
The host never loads those bytes (they come from a sandboxed process): it keeps them as text,
under a size cap, and hands them to children of the same workspace's same code only. The
cache is in memory, per process and per interpreter (the children run the host's own
interpreter, so the bytes always match the version that loads them).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

MAX_ENTRIES = 512
MAX_ENTRY_CHARS = 1024 * 1024  # base64 text of one code object (a call's result cap)
MAX_TOTAL_CHARS = 64 * 1024 * 1024
MAX_PENDING = 16  # compiles asked for and not yet done; more are not asked for
MAX_PENDING_PER_WORKSPACE = 4  # so that one workspace cannot fill the queue


class Compiled:
    """Compiled code by (workspace, source); which code is worth compiling."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._total = 0
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()  # once, not compiled
        self._failed: OrderedDict[tuple[str, str], None] = OrderedDict()  # not asked again
        self._pending: set[tuple[str, str]] = set()

    @staticmethod
    def key(workspace_id: str, code: str) -> tuple[str, str]:
        return workspace_id, hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, key: tuple[str, str]) -> str | None:
        with self._lock:
            made = self._made.get(key)
            if made is not None:
                self._made.move_to_end(key)
            return made

    def wanted(self, key: tuple[str, str]) -> bool:
        """Whether to compile this code now: the second time it is seen without compiled
        code (one-off code, such as most run_code calls, is not compiled twice)."""
        with self._lock:
            if key in self._made or key in self._pending or key in self._failed:
                return False
            if key not in self._seen:
                self._seen[key] = None
                while len(self._seen) > MAX_ENTRIES:
                    self._seen.popitem(last=False)
                return False
            mine = sum(1 for pending in self._pending if pending[0] == key[0])
            if len(self._pending) >= MAX_PENDING or mine >= MAX_PENDING_PER_WORKSPACE:
                return False  # still seen once: asked for again the next time it comes
            del self._seen[key]
            self._pending.add(key)
            return True

    def done(self, key: tuple[str, str], made: str | None) -> None:
        """The compile asked for by ``wanted`` ended: its text, or None (a syntax error, a
        child that failed, text over the cap: the code is compiled per call, as before, and
        not sent to a compile child again, so a broken tool called in a loop does not make
        one every other call)."""
        with self._lock:
            self._pending.discard(key)
            if made is None or len(made) > MAX_ENTRY_CHARS:
                self._failed[key] = None
                while len(self._failed) > MAX_ENTRIES:
                    self._failed.popitem(last=False)
                return
            if key in self._made:
                return
            self._made[key] = made
            self._total += len(made)
            while len(self._made) > MAX_ENTRIES or self._total > MAX_TOTAL_CHARS:
                _, dropped = self._made.popitem(last=False)
                self._total -= len(dropped)

    def __len__(self) -> int:
        with self._lock:
            return len(self._made)
