"""Per-call cgroups for memory and process caps, on cgroup v1 or v2 (whichever has them).

On the reference host v2 is mounted but has no memory or pids controller, while v1 has both;
we take v2 when it offers both controllers, else v1, and report which one is in use.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("toolkiln.sandbox")
V1 = Path("/sys/fs/cgroup")
V2_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


@dataclass(slots=True)
class Handle:
    dirs: list[Path]
    memory_dir: Path


class Cgroups:
    """Makes one cgroup per sandboxed child, caps it, and tells afterwards if it hit OOM."""

    def __init__(self, name: str, memory_bytes: int, pids_max: int) -> None:
        self.memory_bytes = memory_bytes
        self.pids_max = pids_max
        self.version: str | None = None
        self.roots: list[Path] = []
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

    def attach(self, key: str, pid: int) -> Handle | None:
        if self.version is None:
            return None
        dirs = [root / key for root in self.roots]
        for d in dirs:
            d.mkdir(exist_ok=True)
        if self.version == "v2":
            (dirs[0] / "memory.max").write_text(str(self.memory_bytes))
            (dirs[0] / "memory.swap.max").write_text("0") if (
                dirs[0] / "memory.swap.max"
            ).exists() else None
            (dirs[0] / "pids.max").write_text(str(self.pids_max))
        else:
            (dirs[0] / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
            (dirs[1] / "pids.max").write_text(str(self.pids_max))
        for d in dirs:
            (d / "cgroup.procs").write_text(str(pid))
        return Handle(dirs, dirs[0])

    def oom_killed(self, handle: Handle | None) -> bool:
        if handle is None:
            return False
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            for line in (handle.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def release(self, handle: Handle | None) -> None:
        if handle is None:
            return
        for d in handle.dirs:
            try:
                d.rmdir()
            except OSError as exc:  # still has a process: it will be retried on close
                log.debug("cgroup %s not removed yet: %s", d, exc)

    def close(self) -> None:
        for root in self.roots:
            for child in root.glob("c*"):
                with contextlib.suppress(OSError):
                    os.rmdir(child)
            with contextlib.suppress(OSError):
                root.rmdir()
