"""What one call's runs share, whatever runtime each runs in: the root run's cgroup slot
(memory and CPU) and the call's audit quota.

The services hand every run of a call the same ``ResourceShare`` (domain/execution.py); its
``group`` is a ``CallGroup``, made by the first run. The run that finds no slot in it is the
root: its slot becomes the call's, until it ends. Every run nested under it (``run_code``,
custom tools reached through ``ctx``, in either language) moves its process into that slot
for its duration, so 256 MB and one CPU hold for the whole tree, not per process.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from toolkiln.domain.execution import RunRequest
from toolkiln.sandbox.cgroups import Cgroups, Handle
from toolkiln.sandbox.pool import WarmChild
from toolkiln.sandbox.session import AuditQuota

log = logging.getLogger("toolkiln.sandbox")


class JoinFailed(Exception):
    """A nested run's process could not be charged to its call's slot."""


@dataclass(slots=True)
class CallGroup:
    running: bool = False  # the call's root run is running: any other run is nested
    slot: Handle | None = None  # the root run's slot while it runs
    audit: AuditQuota = field(default_factory=AuditQuota)


@dataclass(slots=True)
class Membership:
    """One run's place in its call's group, from ``enter`` to ``exit``."""

    group: CallGroup
    child: WarmChild
    root: bool
    oom_before: int = 0
    cgroups: Cgroups | None = None
    held: Handle | None = None  # the call's slot this run holds (Cgroups.hold, join)

    def shared_oom(self) -> bool:
        """A nested run's process was the one the call's memory cap killed."""
        if self.root or self.cgroups is None or self.group.slot is None:
            return False
        return self.cgroups.oom_count(self.group.slot) > self.oom_before

    def exit(self) -> None:
        if self.root:
            self.group.running, self.group.slot = False, None
        elif self.child.cgroup is not None:
            with contextlib.suppress(OSError):  # gone already: nothing to move back
                Cgroups.leave(self.child.global_pid, self.child.cgroup)
        if self.held is not None and self.cgroups is not None:
            self.cgroups.let_go(self.held)
            self.held = None


def enter(req: RunRequest, child: WarmChild, cgroups: Cgroups | None) -> Membership:
    """The run's membership of its call's group, the child joined to the call's slot if it
    is a nested run. ``JoinFailed`` if it cannot be: the run must not go uncapped."""
    share = req.share
    group = share.group if share is not None else None
    if not isinstance(group, CallGroup):
        group = CallGroup()
        if share is not None:
            share.group = group
    if not group.running:
        group.running, group.slot = True, child.cgroup
        if child.cgroup is None or cgroups is None:
            return Membership(group, child, True)
        # Held until the root run ends, not only while its process lives: a nested run may
        # join the slot after the root's process has gone (it made a ctx call and exited).
        cgroups.hold(child.cgroup)
        return Membership(group, child, True, cgroups=cgroups, held=child.cgroup)
    if group.slot is None or child.cgroup is None or cgroups is None:
        return Membership(group, child, False)  # no cgroups here (insecure mode): caps off
    slot = group.slot
    member = Membership(group, child, False, cgroups.oom_count(slot), cgroups, slot)
    try:
        cgroups.join(child.global_pid, slot)
    except OSError as exc:
        log.error("could not charge a nested run to its call's cgroup: %s", exc)
        member.exit()  # back to its own slot, as far as it got; the slot counts it out
        raise JoinFailed(str(exc)) from None
    return member
