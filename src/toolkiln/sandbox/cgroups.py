"""Per-call cgroups for memory and process caps, on cgroup v1 or v2 (whichever has them).

On the reference host v2 is mounted but has no memory or pids controller, while v1 has both;
we take v2 when it offers both controllers, else v1, and report which one is in use.
Slots are made once and reused: attaching to a pre-made group costs ~0.03 ms, while a
mkdir/rmdir per call costs far more (SANDBOX-NOTES). A slot holds one process at a time.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

V1 = Path("/sys/fs/cgroup")
V2_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


@dataclass(slots=True)
class Handle:
    """A slot's directories; ``oom_before`` is its oom_kill count when it was handed out."""

    dirs: list[Path]
    memory_dir: Path
    oom_before: int = 0


class Cgroups:
    """Caps each sandboxed child's memory and tasks, and tells afterwards if it hit OOM."""

    def __init__(self, name: str, memory_bytes: int, pids_max: int) -> None:
        self.memory_bytes = memory_bytes
        self.pids_max = pids_max
        self.version: str | None = None
        self.roots: list[Path] = []
        self._free: list[Handle] = []
        self._made = 0
        self._lock = threading.Lock()
        v2 = next((p for p in V2_CANDIDATES if self._v2_has(p, {"memory", "pids"})), None)
        if v2 is not None:
            self.version = "v2"
            root = v2 / f"toolkiln-{name}"
            root.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                (v2 / "cgroup.subtree_control").write_text("+memory +pids")
            (root / "cgroup.subtree_control").write_text("+memory +pids")
            self.roots = [root]
        elif (V1 / "memory" / "cgroup.procs").exists() and (V1 / "pids" / "cgroup.procs").exists():
            self.version = "v1"
            self.roots = [V1 / "memory" / f"toolkiln-{name}", V1 / "pids" / f"toolkiln-{name}"]
            for root in self.roots:
                root.mkdir(exist_ok=True)

    @staticmethod
    def _v2_has(path: Path, wanted: set[str]) -> bool:
        try:
            return wanted <= set((path / "cgroup.controllers").read_text().split())
        except OSError:
            return False

    def _make(self) -> Handle:
        self._made += 1
        dirs = [root / f"slot{self._made}" for root in self.roots]
        for d in dirs:
            d.mkdir(exist_ok=True)
        if self.version == "v2":
            (dirs[0] / "memory.max").write_text(str(self.memory_bytes))
            swap = dirs[0] / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            (dirs[0] / "pids.max").write_text(str(self.pids_max))
        else:
            (dirs[0] / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
            (dirs[1] / "pids.max").write_text(str(self.pids_max))
        return Handle(dirs, dirs[0])

    def attach(self, pid: int) -> Handle | None:
        """Put a process (and any thread it starts) in a free slot of its own."""
        if self.version is None:
            return None
        with self._lock:
            handle = self._free.pop() if self._free else self._make()
        handle.oom_before = self._oom_count(handle)
        for d in handle.dirs:
            (d / "cgroup.procs").write_text(str(pid))
        return handle

    def _oom_count(self, handle: Handle) -> int:
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            for line in (handle.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_killed(self, handle: Handle | None) -> bool:
        return handle is not None and self._oom_count(handle) > handle.oom_before

    def release(self, handle: Handle | None) -> None:
        """The slot's process has been reaped: the slot is free for the next one."""
        if handle is not None:
            with self._lock:
                self._free.append(handle)

    def close(self) -> None:
        for root in self.roots:
            for slot in root.glob("slot*"):
                with contextlib.suppress(OSError):
                    os.rmdir(slot)
            with contextlib.suppress(OSError):
                root.rmdir()
