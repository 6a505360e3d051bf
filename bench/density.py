"""Memory of the service and its sandbox processes, from /proc/<pid>/smaps_rollup.

USS (private pages: what killing the process would free) and PSS (shared pages split among
the processes sharing them). The process tree under `toolkiln serve` is
service -> template launcher -> template (PID 1 of its namespace) -> warm children;
the JavaScript template's config names its runtime, and the Python template for code that
says `async` (with asyncio preloaded) says `"asyncio": true`.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Mem:
    uss_kb: int
    pss_kb: int


def mem(pid: int) -> Mem | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return Mem(uss, fields.get("Pss", 0))


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def measure(service_pid: int) -> dict[str, object]:
    """Service, per template, and per warm child (median over the children)."""
    tree = _children()
    out: dict[str, object] = {"service": mem(service_pid)}
    for launcher in tree.get(service_pid, []):
        cmd = _cmdline(launcher)
        if "template.py" not in cmd:
            continue
        kind = "javascript" if '"runtime": "javascript"' in cmd else "python"
        if '"asyncio": true' in cmd:
            kind = "python_async"
        for template in tree.get(launcher, []):
            kids = [m for c in tree.get(template, []) if (m := mem(c)) is not None]
            out[f"{kind}_template"] = mem(template)
            if kids:
                out[f"{kind}_child"] = Mem(
                    int(statistics.median(k.uss_kb for k in kids)),
                    int(statistics.median(k.pss_kb for k in kids)),
                )
                out[f"{kind}_children"] = len(kids)
    return out


def settled(service_pid: int, warm: int, wait_s: float = 15.0) -> dict[str, object]:
    """Measure once the Python pool is refilled after the load run (or after ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    found = measure(service_pid)
    while int(str(found.get("python_children", 0))) < warm and time.monotonic() < deadline:
        time.sleep(0.2)
        found = measure(service_pid)
    return found


def cpu_ms(pid: int, with_reaped: bool = False) -> float:
    """CPU time of a process (and of its reaped children), in ms."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if with_reaped else 0)
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def tree_cpu_ms(root: int) -> float:
    """CPU of every process under ``root`` (not ``root`` itself), reaped children included."""
    tree = _children()
    total, todo = 0.0, list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        todo += tree.get(pid, [])
        try:
            total += cpu_ms(pid, with_reaped=True)
        except OSError:
            continue
    return total


def lines(found: dict[str, object]) -> list[str]:
    def mb(m: object) -> str:
        if not isinstance(m, Mem):
            return "not found"
        return f"USS {m.uss_kb / 1024:6.1f} MB, PSS {m.pss_kb / 1024:6.1f} MB"

    rows = [
        f"| service process (toolkiln serve) | {mb(found.get('service'))} |",
        f"| Python template | {mb(found.get('python_template'))} |",
        f"| per warm Python child ({found.get('python_children', 0)} warm) "
        f"| {mb(found.get('python_child'))} |",
        f"| Python template for `async` code (asyncio preloaded) "
        f"| {mb(found.get('python_async_template'))} |",
        f"| per warm child of it ({found.get('python_async_children', 0)} warm) "
        f"| {mb(found.get('python_async_child'))} |",
        f"| JavaScript template | {mb(found.get('javascript_template'))} |",
        f"| per JavaScript worker ({found.get('javascript_children', 0)} running) "
        f"| {mb(found.get('javascript_child'))} |",
    ]
    kinds = (
        ("python", "Python child"),
        ("python_async", "child for `async` code"),
        ("javascript", "JavaScript worker"),
    )
    for kind, what in kinds:
        m = found.get(f"{kind}_child")
        if isinstance(m, Mem) and m.pss_kb:
            # One call in flight holds one child (Python) or one worker (JavaScript).
            rows.append(
                f"| calls in flight per GB, {kind} (1 GB / PSS of one {what}) "
                f"| {1024 * 1024 // m.pss_kb} |"
            )
    return rows
