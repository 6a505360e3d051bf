"""Runner processes for the topology tests: ``toolkiln runner`` started as an operator would,
and what /proc says of a process (its environment, open files, children)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.reliability.harness import TOOLKILN, free_port, wait_listening


class Runner:
    """One real ``toolkiln runner --listen 127.0.0.1:PORT`` process."""

    def __init__(self, data_dir: Path, token: str, **env: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = data_dir.parent / f"runner-{self.port}.log"
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        full = {
            **keep,
            "TOOLKILN_DATA_DIR": str(data_dir),
            "TOOLKILN_RUNNER_TOKEN": token,
            "TOOLKILN_SANDBOX_WARM": "2",
            "TOOLKILN_SANDBOX_JS_WORKERS": "1",
            **env,
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [TOOLKILN, "runner", "--listen", self.address],
                env=full,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_listening(self) -> Runner:
        wait_listening(f"runner on {self.port}", self.proc, self.output)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(30)

    def kill(self) -> None:
        """As a machine lost: the runner and its whole process group at once."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")


def open_files(pid: int) -> list[str]:
    """What each descriptor of ``pid`` names (files, sockets, pipes)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.append(os.readlink(fd))
        except OSError:
            continue
    return found


def tcp_peers(pid: int) -> set[int]:
    """Remote ports of the TCP connections ``pid`` holds open."""
    inodes = {
        name.removeprefix("socket:[").rstrip("]")
        for name in open_files(pid)
        if name.startswith("socket:[")
    }
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            parts = line.split()
            if parts[9] in inodes:
                ports.add(int(parts[2].rsplit(":", 1)[1], 16))
    return ports


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
