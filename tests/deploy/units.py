"""A systemd unit of deploy/systemd started as systemd would start it, where systemd is not
PID 1 (this machine): the unit's [Service] settings that decide who the process is and what
it may do are read and applied with util-linux's setpriv, as systemd.exec(5) says:

- ``User=``/``Group=`` (``--reuid``/``--regid``, ``--init-groups``); ``DynamicUser=yes``
  as a uid no one has, from systemd's range for dynamic users, with no groups;
- ``CapabilityBoundingSet=`` (``--bounding-set``), ``AmbientCapabilities=`` (inheritable
  and ambient), ``NoNewPrivileges=yes`` or any setting the manual says implies it;
- ``Environment=``, ``EnvironmentFile=``, ``%S``, ``StateDirectory=`` (made, owned by the
  user, ``StateDirectoryMode=``), ``UMask=``.

What only systemd's own mount namespace gives (``ProtectSystem=``, ``ProtectHome=``,
``PrivateTmp=``, ``RuntimeDirectory=``) and its system-call and address-family filters are
not applied: ``systemd-analyze verify`` checks them (tests/deploy/test_systemd.py).
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.runners import rootless

# systemd.exec(5), NoNewPrivileges=: these settings make it true whatever it says.
IMPLY_NO_NEW_PRIVS = (
    "DynamicUser", "LockPersonality", "MemoryDenyWriteExecute", "PrivateDevices",
    "ProtectClock", "ProtectHostname", "ProtectKernelLogs", "ProtectKernelModules",
    "ProtectKernelTunables", "RestrictAddressFamilies", "RestrictNamespaces",
    "RestrictRealtime", "RestrictSUIDSGID", "SystemCallArchitectures", "SystemCallFilter",
    "SystemCallLog",
)  # fmt: skip
DYNAMIC_UIDS = range(61184, 65520)  # systemd's range for DynamicUser=
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def service(text: str) -> dict[str, list[str]]:
    """A unit's [Service] section, each key with every value it was given."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def no_new_privs(values: dict[str, list[str]]) -> bool:
    if values.get("NoNewPrivileges", ["no"])[-1] == "yes":
        return True
    return any(key in values for key in IMPLY_NO_NEW_PRIVS)


def _caps(value: str) -> str:
    """``CAP_A CAP_B`` as setpriv's ``-all,+a,+b``."""
    return ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in value.split())])


def _free_dynamic_uid() -> int:
    taken = {p.pw_uid for p in pwd.getpwall()} | {p.pw_gid for p in pwd.getpwall()}
    return next(u for u in reversed(DYNAMIC_UIDS) if u not in taken)


@dataclass
class Started:
    """A unit's main process, its uid and its output."""

    proc: subprocess.Popen[bytes]
    uid: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        rootless.stop(self.proc)


def start(text: str, state: Path, log: Path) -> Started:
    """Starts the unit ``text`` (with the test's substitutions made), ``%S`` being
    ``state``; its output goes to ``log``."""
    values = service(text.replace("%S", str(state)))
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8"}
    for path in values.get("EnvironmentFile", []):
        for line in Path(path.lstrip("-")).read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip()
    for line in values.get("Environment", []):
        env.update(word.split("=", 1) for word in shlex.split(line))  # type: ignore[misc]
    if values.get("DynamicUser", ["no"])[-1] == "yes":
        uid = gid = _free_dynamic_uid()
        who = ["--reuid", str(uid), "--regid", str(gid), "--clear-groups"]
    else:
        (user,) = values["User"]
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
        group = values.get("Group", [str(gid)])[-1]
        who = ["--reuid", user, "--regid", group, "--init-groups"]
        env |= {"USER": user, "LOGNAME": user, "HOME": entry.pw_dir}
    for name in values.get("StateDirectory", []):
        made = state / name
        made.mkdir(parents=True, exist_ok=True)
        os.chown(made, uid, gid)
        made.chmod(int(values.get("StateDirectoryMode", ["0755"])[-1], 8))
    bounding = values.get("CapabilityBoundingSet", [None])[-1]
    ambient = values.get("AmbientCapabilities", [""])[-1]
    caps = ["--bounding-set", _caps(bounding)] if bounding is not None else []
    caps += ["--inh-caps", _caps(ambient), "--ambient-caps", _caps(ambient)]
    argv = ["setpriv", *who, *caps]
    if no_new_privs(values):
        argv.append("--no-new-privs")
    (command,) = values["ExecStart"]
    umask = os.umask(int(values.get("UMask", ["0022"])[-1], 8))  # the child's, inherited
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*argv, "--", *shlex.split(command)],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    finally:
        os.umask(umask)
    return Started(proc, uid, log)
