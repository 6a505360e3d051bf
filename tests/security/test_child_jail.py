"""What every new sandbox process is before any of its own code runs, read by the host from
/proc: its own uid and gid and no groups, no_new_privs and the seccomp filter, the rlimits
child.py decides, non-dumpable, and no descriptor of the template's but its channel. Since
_spawn.c does this in C between fork and the child's first Python (it was
child.become in Python); these hold whichever does it."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.security.conftest import Target

sys.path.insert(0, str(Path(__file__).parents[2] / "src" / "toolkiln" / "sandbox" / "jail"))
import child  # the jail's own module, as the template imports it

LIMIT_NAMES = {  # resource -> its line in /proc/<pid>/limits
    "RLIMIT_CPU": "Max cpu time",
    "RLIMIT_AS": "Max address space",
    "RLIMIT_NPROC": "Max processes",
    "RLIMIT_NOFILE": "Max open files",
    "RLIMIT_FSIZE": "Max file size",
    "RLIMIT_CORE": "Max core file size",
    "RLIMIT_MEMLOCK": "Max locked memory",
    "RLIMIT_MSGQUEUE": "Max msgqueue size",
}


def _warm(target: Target, runtime: str) -> list[tuple[int, dict]]:
    """(pid, the sandbox's template config) of each warm process of a runtime, once its pool
    is full (no call runs here, so every process of its uids is a warm one)."""
    sandbox = target.runtime.sandboxes[runtime]
    low, high = sandbox.uids.first, sandbox.uids.first + sandbox.uids.count
    deadline = time.monotonic() + 10
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            if low <= uid < high:
                cfg = next(
                    t.config
                    for t in sandbox.templates()
                    if t.config.uid_base <= uid < t.config.uid_base + t.config.uid_count
                )
                found.append((int(entry.name), cfg))
        if found and len(found) >= sum(t.health()["warm"] for t in sandbox.templates()):
            return found
        assert time.monotonic() < deadline, f"no warm {runtime} process"
        time.sleep(0.05)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _limits(pid: int) -> dict[str, tuple[str, str]]:
    found = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]:
        name = line[:26].strip()
        soft, hard = line[26:].split()[:2]
        found[name] = (soft, hard)
    return found


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_a_new_process_is_jailed_before_its_first_line(target: Target, runtime: str) -> None:
    import resource

    seen = 0
    kinds = set()
    for pid, cfg in _warm(target, runtime):
        try:
            status = _status(pid)
            limits = _limits(pid)
            fds = _inodes(pid)
            template = _inodes(int(status["PPid"]))
            owner = os.stat(f"/proc/{pid}/status").st_uid
        except FileNotFoundError:
            continue  # taken and ended meanwhile
        seen += 1
        uid = int(status["Uid"].split()[0])
        assert status["Uid"].split() == [str(uid)] * 4, status["Uid"]
        assert status["Gid"].split() == [str(uid)] * 4, status["Gid"]
        assert status["Groups"] == ""
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"  # filter mode
        # A Python child: the template's part and its own (seccomp.split_filter); a
        # JavaScript worker installs the whole allowlist in one.
        assert status["Seccomp_filters"] == ("2" if runtime == "python" else "1")
        # Non-dumpable: its /proc files belong to root, not to its uid (no ptrace, no core).
        assert owner == 0
        for res, soft, hard in child.limits(cfg):
            name = next(n for n in LIMIT_NAMES if getattr(resource, n) == res)
            assert limits[LIMIT_NAMES[name]] == (str(soft), str(hard)), name
        # Nothing of the template's (its control socket, its reap pipe) but stdin, stdout
        # and stderr (/dev/null): a Python child has those and its channel alone.
        shared = {fd for fd, ino in fds.items() if fd > 2 and ino in template.values()}
        assert not shared, f"the template's descriptors {shared} in {pid}"
        if runtime == "python":
            channel = max(fds)
            assert stat.S_ISSOCK(os.stat(f"/proc/{pid}/fd/{channel}").st_mode)
            # A child of the template for code that says async has made its event loop
            # (pyrunner._prepare_loop), after the fork: its epoll and its self-pipe.
            says_async = cfg.asyncio
            kinds.add(says_async)
            loop = sorted(set(fds) - {0, 1, 2, channel})
            if says_async:
                links = sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in loop)
                assert len(links) == 3 and links[0] == "anon_inode:[eventpoll]", (fds, links)
                assert all(link.startswith("socket:") for link in links[1:]), links
            else:
                assert loop == [], fds
    assert seen, f"no warm {runtime} process was read"
    if runtime == "python":
        assert kinds == {False, True}, "the children of both Python templates were read"


def _inodes(pid: int) -> dict[int, int]:
    """Each open descriptor of a process and the inode it names."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(fd)] = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except FileNotFoundError:
            continue
    return found
