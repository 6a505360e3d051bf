"""Building the image with `make image` and running it with Debian's podman (rootful podman on
this host, the container as the image's unprivileged user: the shape docs/deployment.md
documents).

Here no image registry is reachable: `make image-base` makes the base the Containerfile names
from Debian's packages, once (an image of that name already there is kept). The build reuses
podman's layer cache, so a run after a change to the sources rebuilds only the last layers.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT
from toolkiln.sandbox.cgroups import undelegate

IMAGE = "localhost/toolkiln:test"
# crun refuses this host's hybrid cgroup layout; runc is what `make containers` installs.
PODMAN = ["podman", "--runtime", "runc"]
# The host's own hard limits: root here has no CAP_SYS_RESOURCE to give a container more
# than the shell has (podman's defaults are higher). Not part of the documented command.
HOST_LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
BUILD_TIMEOUT_S = 1200
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def logs(name: str) -> str:
    """A container's output (its standard error is where the service logs)."""
    done = subprocess.run(
        [*PODMAN, "logs", name], capture_output=True, text=True, timeout=60, check=False
    )
    return (done.stdout + done.stderr)[-3000:]


def build_image() -> str:
    """`make image-base image`, as a user would (with the base made locally, as here)."""
    done = subprocess.run(
        ["make", "-s", "image-base", "image", f"IMAGE={IMAGE}", f"PODMAN={shlex.join(PODMAN)}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"make image failed:\n{(done.stdout + done.stderr)[-4000:]}"
    return IMAGE


def documented_run() -> list[str]:
    """The `podman run` command docs/deployment.md shows, as arguments after `podman`."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    block = re.search(r"```sh\n(podman run .*?)```", text, re.S)
    assert block, "docs/deployment.md shows no `podman run` command"
    words = shlex.split(block.group(1).replace("\\\n", " "), comments=True)
    assert words[:2] == ["podman", "run"], words[:2]
    return words[1:]


def substitute(words: list[str], replace: dict[str, str]) -> list[str]:
    """Each documented value the test replaces (a name, a port, a host path) must be there."""
    out = list(words)
    for old, new in replace.items():
        hits = [i for i, w in enumerate(out) if old in w]
        assert hits, f"the documented command has no {old!r}"
        for i in hits:
            out[i] = out[i].replace(old, new)
    return out


@dataclass
class Delegated:
    """Host cgroup directories lent to one container (cgroup v1: one per controller)."""

    name: str

    def paths(self) -> list[Path]:
        return [Path("/sys/fs/cgroup") / c / self.name for c in CGROUP_CONTROLLERS]

    def make(self) -> None:
        """Delegated to the image's user, as docs/deployment.md says to."""
        for path in self.paths():
            path.mkdir(exist_ok=True)
            os.chown(path, IMAGE_UID, -1)
            for entry in path.iterdir():
                os.chown(entry, IMAGE_UID, -1)

    def remove(self) -> None:
        undelegate(self.paths())


@dataclass(frozen=True)
class HostView:
    """A process of the container as the host sees it in /proc/<pid>/status and stat."""

    pid: int
    ppid: int
    name: str
    uids: tuple[int, ...]  # real, effective, saved, filesystem
    cap_eff: int
    cap_bnd: int
    cpu_ticks: int  # user + system time, in clock ticks


def host_view(pid: int) -> HostView | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # gone meanwhile
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return HostView(
        pid=pid,
        ppid=int(fields["PPid"]),
        name=fields["Name"].strip(),
        uids=tuple(int(u) for u in fields["Uid"].split()),
        cap_eff=int(fields["CapEff"], 16),
        cap_bnd=int(fields["CapBnd"], 16),
        cpu_ticks=int(stat[11]) + int(stat[12]),  # utime, stime (proc(5), after the name)
    )


def descendants(root: int) -> Iterator[HostView]:
    """The process ``root`` and everything below it, read from the host's /proc."""
    views = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (view := host_view(int(entry))) is not None:
            views[view.pid] = view
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in views:
            yield views[pid]
            todo.extend(v.pid for v in views.values() if v.ppid == pid)


# Capability numbers (linux/capability.h) of what the documented command grants.
CAPS = {"DAC_OVERRIDE": 1, "SETGID": 6, "SETUID": 7, "SYS_ADMIN": 21}
# What a runner that is root (of the host, or of a pod's user namespace: the root systemd
# unit, the Kubernetes runner) holds for the jail, each measured by removing it
# (docs/decisions/200-image-and-manifests.md; docs/deployment.md, "What the service needs").
ROOT_RUNNER_CAPS = ("CHOWN", "DAC_READ_SEARCH", "KILL", "SETGID", "SETUID", "SYS_ADMIN")
# The image's user (Containerfile) and the ids its /etc/subuid and /etc/subgid give it: in a
# rootful container without a user namespace, these are host ids.
IMAGE_UID = 10001
SUBUIDS = range(100_000, 165_536)


def cap_names(mask: int) -> set[str]:
    return {name for name, bit in CAPS.items() if mask & (1 << bit)} | (
        {"other"} if mask & ~sum(1 << b for b in CAPS.values()) else set()
    )
