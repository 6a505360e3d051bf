"""Memory of the service and its sandbox processes, from /proc/<pid>/smaps_rollup.

USS (private pages: what killing the process would free) and PSS (shared pages split among
the processes sharing them). The process tree under `toolkiln serve` is
service -> embedded `toolkiln runner` -> template launcher -> template (PID 1 of its
namespace) -> warm children. The launchers are found at any depth (the topmost `template.py`
processes), so the finder does not depend on where the runner sits. Each template's config
(the JSON object on its command line) names its runtime, and the Python template for code
that says `async` (asyncio preloaded) has `asyncio` true.
"""

from __future__ import annotations

import json
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


def _config(pid: int) -> dict[str, object]:
    """The JSON config a template process was started with: its argument that is a JSON
    object ({} if none is)."""
    for arg in _cmdline(pid).split("\0"):
        if arg.startswith("{"):
            try:
                found = json.loads(arg)
            except ValueError:
                continue
            return found if isinstance(found, dict) else {}
    return {}


def _launchers(tree: dict[int, list[int]], root: int) -> list[int]:
    """The template launchers under ``root``: the topmost ``template.py`` processes."""
    found, todo = [], list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        if "template.py" in _cmdline(pid):
            found.append(pid)
        else:
            todo += tree.get(pid, [])
    return found


def runner_of(service_pid: int) -> int | None:
    """The embedded ``toolkiln runner`` process of a service, if it has one."""
    for pid in _children().get(service_pid, []):
        if "\0runner\0" in _cmdline(pid):
            return pid
    return None


def measure(service_pid: int) -> dict[str, object]:
    """Service, its runner, per template, and per warm child (median over the children)."""
    tree = _children()
    out: dict[str, object] = {"service": mem(service_pid)}
    runner = runner_of(service_pid)
    if runner is not None:
        out["runner"] = mem(runner)
    for launcher in _launchers(tree, service_pid):
        config = _config(launcher)
        kind = "javascript" if config.get("runtime") == "javascript" else "python"
        if config.get("asyncio") is True:
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


def _mb(m: object) -> str:
    if not isinstance(m, Mem):
        return "not found"
    return f"{m.uss_kb / 1024:.1f} / {m.pss_kb / 1024:.1f} MB"


ROWS = (
    ("service process (toolkiln serve)", "service", None),
    ("its embedded runner (toolkiln runner)", "runner", None),
    ("Python template", "python_template", None),
    ("per warm Python child", "python_child", "python_children"),
    ("Python template for `async` code (asyncio preloaded)", "python_async_template", None),
    ("per warm child of it", "python_async_child", "python_async_children"),
    ("JavaScript template", "javascript_template", None),
    ("per JavaScript worker", "javascript_child", "javascript_children"),
)
IN_FLIGHT = (
    ("python", "Python child"),
    ("python_async", "child for `async` code"),
    ("javascript", "JavaScript worker"),
)


def lines(found: dict[str, dict[str, object]]) -> list[str]:
    """The memory table, a column per database (``found``: label -> ``measure``'s answer)."""
    labels = list(found)
    rows = [
        f"| memory after the load run, USS / PSS | {' | '.join(labels)} |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for what, key, count in ROWS:
        cells = []
        for label in labels:
            cell = _mb(found[label].get(key))
            if count is not None and isinstance(found[label].get(key), Mem):
                cell += f" ({found[label].get(count, 0)} running)"
            cells.append(cell)
        rows.append(f"| {what} | {' | '.join(cells)} |")
    for kind, what in IN_FLIGHT:
        # One call in flight holds one child (Python) or one worker (JavaScript).
        cells = []
        for label in labels:
            m = found[label].get(f"{kind}_child")
            cells.append(str(1024 * 1024 // m.pss_kb) if isinstance(m, Mem) and m.pss_kb else "-")
        rows.append(f"| calls in flight per GB (1 GB / PSS of one {what}) | {' | '.join(cells)} |")
    return rows
