"""The sandbox's isolation layers by name: what each gives, how a host gives it, and the
refusal a runner starts with when one is missing and not accepted (docs/security.md,
"Refusing to run insecurely").

A runner needs every layer unless ``TOOLKILN_SANDBOX_ACCEPT`` names it (or
``TOOLKILN_SANDBOX_INSECURE`` accepts them all); an accepted missing layer is listed by
``/healthz`` under ``degraded``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from toolkiln.sandbox.jail.config import LAYERS

_USERNS = (
    "run the runner as root of a user namespace (rootless Podman, a Kubernetes pod with "
    "hostUsers: false), or as a user with ranges in /etc/subuid and /etc/subgid and "
    "Debian's uidmap installed (newuidmap), on a kernel with unprivileged user namespaces"
)

WHAT = {
    "namespaces": "mount, PID, network, IPC and UTS namespaces of the jail's own",
    "readonly_root": "a read-only root with only the interpreter's files",
    "seccomp": "the system-call allowlist",
    "no_new_privs": "no_new_privs on every process that runs tool code",
    "uid": "an unprivileged uid of its own for each concurrent call",
    "rlimits": "per-process resource limits",
    "cgroup": "per-call-tree memory, CPU and process limits (a cgroup)",
    "runner_uid": "the runner itself at an unprivileged host uid, not the host's root",
}

HOW = {
    "namespaces": _USERNS,
    "readonly_root": _USERNS
    + "; a seccomp profile and security module (AppArmor, SELinux) that allow mount and "
    "pivot_root",
    "seccomp": "a Linux kernel on x86_64 with seccomp filters (CONFIG_SECCOMP_FILTER)",
    "no_new_privs": "a Linux kernel on x86_64 with seccomp filters (CONFIG_SECCOMP_FILTER)",
    "uid": "give the runner's user ranges in /etc/subuid and /etc/subgid (`usermod "
    "--add-subuids 100000-165535 --add-subgids 100000-165535 USER`, with Debian's uidmap), "
    "or run it as root of a user namespace that maps at least 65,536 ids",
    "rlimits": "a Linux kernel (setrlimit)",
    "cgroup": "delegate a cgroup to the runner's user and name it with "
    "TOOLKILN_SANDBOX_CGROUP: on cgroup v1 a directory of that name in each of the memory, "
    "pids and cpu hierarchies, owned by the user (`mkdir /sys/fs/cgroup/memory/NAME && chown "
    "USER /sys/fs/cgroup/memory/NAME`, the same for pids and cpu); on cgroup v2 a directory "
    "owned by the user with memory and pids in its parent's cgroup.subtree_control "
    "(systemd: Delegate=yes)",
    "runner_uid": "a kernel with user namespaces (sysctl user.max_user_namespaces above 0) "
    "that lets the host's root map a range of ids (TOOLKILN_SANDBOX_SUBUIDS, or the range of "
    "the user toolkiln in /etc/subuid and /etc/subgid), or run the API as an unprivileged "
    "user",
}


@dataclass(frozen=True, slots=True)
class Missing:
    """A layer the host did not give, and what the kernel answered."""

    layer: str
    reason: str

    def refusal(self) -> str:
        return (
            f"the sandbox cannot give its {self.layer} layer ({WHAT[self.layer]}): "
            f"{self.reason}. To give it: {HOW[self.layer]}. To run without it: "
            f"TOOLKILN_SANDBOX_ACCEPT={self.layer}"
        )


def parse_accept(value: str) -> tuple[str, ...]:
    """``TOOLKILN_SANDBOX_ACCEPT``: layer names, comma-separated; an unknown one is an
    error (a misspelt name must not leave a layer unexpectedly required, or accepted)."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer {unknown[0]!r}: the layers are {', '.join(LAYERS)}")
    return names


def refused(missing: Iterable[Missing], accepted: Iterable[str]) -> list[Missing]:
    """The missing layers that stop a start."""
    keep = set(accepted)
    return [m for m in missing if m.layer not in keep]
