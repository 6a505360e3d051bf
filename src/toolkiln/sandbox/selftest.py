"""The runner's start-up self-test: each isolation layer proved by its effect on a real warm
process, read by the host from /proc (what the kernel holds for it), never from what a
template or a set-up step said of itself.

| layer | proved by |
|---|---|
| namespaces | its mount, PID, network, IPC and UTS namespaces are not the runner's |
| readonly_root | its root is a read-only mount, and the runner's own root is not its root |
| seccomp | it runs under a seccomp filter (``Seccomp: 2``) |
| no_new_privs | ``NoNewPrivs: 1`` |
| uid | all four of its uids and gids are one id of the sandbox's range, not the runner's |
| rlimits | its address-space (Python) or CPU-time limit is the configured one |
| cgroup | it is in a memory slot of the sandbox whose limit is the call's cap, and a pids slot |

A layer the template reported missing is not tested again; one it reported present that
this does not see is missing too (``Missing``), and refuses the start unless accepted.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.layers import Missing
from toolkiln.sandbox.pool import Template

NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")
WAIT_S = 30.0
SETTLE_S = 2.0


def prove(template: Template, memory_bytes: int) -> list[Missing]:
    """The layers the template claims that a warm process of it does not show."""
    pid = _warm_pid(template)
    if pid is None:
        return [Missing("namespaces", "self-test: no warm sandbox process to look at")]
    claimed = {m.layer for m in template.missing}
    todo = {layer: check for layer, check in CHECKS.items() if layer not in claimed}
    # The host adopts a child as soon as it is forked, while _spawn.c may still be jailing
    # it: a layer not seen yet is looked at again until it shows, for SETTLE_S at most (a
    # child is jailed within milliseconds; a missing layer never shows).
    deadline = time.monotonic() + SETTLE_S
    while True:
        unseen: dict[str, str] = {}
        for layer, check in todo.items():
            try:
                why = check(pid, template, memory_bytes)
            except OSError as exc:
                why = f"could not read /proc/{pid}: {exc}"
            if why is not None:
                unseen[layer] = why
        if not unseen or time.monotonic() > deadline:
            return [Missing(layer, f"self-test: {why}") for layer, why in unseen.items()]
        todo = {layer: todo[layer] for layer in unseen}
        time.sleep(0.01)


def _warm_pid(template: Template) -> int | None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for child in template.warm_children():
            if child.alive():
                return child.global_pid
        time.sleep(0.02)
    return None


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _namespaces(pid: int, template: Template, memory_bytes: int) -> str | None:
    same = [
        ns
        for ns in NAMESPACES
        if os.stat(f"/proc/{pid}/ns/{ns}").st_ino == os.stat(f"/proc/self/ns/{ns}").st_ino
    ]
    return f"it shares the runner's {', '.join(same)} namespace" if same else None


def _readonly_root(pid: int, template: Template, memory_bytes: int) -> str | None:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            options = fields[5].split(",")
            return None if "ro" in options else "its root is mounted writable"
    return "it has no root mount"


def _seccomp(pid: int, template: Template, memory_bytes: int) -> str | None:
    return None if _status(pid).get("Seccomp") == "2" else "it has no seccomp filter"


def _no_new_privs(pid: int, template: Template, memory_bytes: int) -> str | None:
    return None if _status(pid).get("NoNewPrivs") == "1" else "no_new_privs is not set"


def _uid(pid: int, template: Template, memory_bytes: int) -> str | None:
    status = _status(pid)
    uids, gids = status["Uid"].split(), status["Gid"].split()
    cfg: JailConfig = template.config
    first = int(uids[0])
    mine = cfg.uid_base <= first < cfg.uid_base + cfg.uid_count
    if len(set(uids)) == 1 and gids == uids and mine and first != os.geteuid():
        return None
    return f"it runs as uids {status['Uid']}, gids {status['Gid']}"


def _rlimits(pid: int, template: Template, memory_bytes: int) -> str | None:
    cfg: JailConfig = template.config
    name, want = (
        ("Max cpu time", cfg.worker_cpu_s or cfg.max_cpu_s)
        if cfg.javascript
        else ("Max address space", cfg.address_space_mb * 1024 * 1024)
    )
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            soft = line[26:].split()[0]
            return None if soft == str(want) else f"{name} is {soft}, not {want}"
    return f"no {name} limit"


def _cgroup(pid: int, template: Template, memory_bytes: int) -> str | None:
    """Listed in the ``cgroup.procs`` of one of the sandbox's memory slots and one of its
    pids slots (read there, not from /proc/<pid>/cgroup, whose paths are the host's where
    a container lends the runner its cgroup directories), whose memory limit is the cap."""
    cgroups = template.cgroups
    if cgroups is None or cgroups.version is None:
        return "no cgroup"
    memory = _slot_of(pid, cgroups.roots[0])
    if memory is None or (cgroups.version == "v1" and _slot_of(pid, cgroups.roots[1]) is None):
        return "it is in no slot of the sandbox's cgroups"
    name = "memory.limit_in_bytes" if cgroups.version == "v1" else "memory.max"
    limit = (memory / name).read_text().strip()
    return None if limit == str(memory_bytes) else f"its memory limit is {limit}"


def _slot_of(pid: int, root: Path) -> Path | None:
    for slot in root.glob("slot*"):
        with contextlib.suppress(OSError):
            if str(pid) in (slot / "cgroup.procs").read_text().split():
                return slot
    return None


CHECKS = {
    "namespaces": _namespaces,
    "readonly_root": _readonly_root,
    "seccomp": _seccomp,
    "no_new_privs": _no_new_privs,
    "uid": _uid,
    "rlimits": _rlimits,
    "cgroup": _cgroup,
}
