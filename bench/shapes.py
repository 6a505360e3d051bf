"""The runner shapes side by side, on each database: the embedded default (the runner
`serve` starts, on a Unix socket) against a `toolkiln runner` of its own reached over
loopback TCP, each measured in turn on a service of its own with a database of its own
(BENCH_SEQ sequential calls of the Python and JavaScript tools, the ctx round trip)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import databases
from client import Conn
from service import (
    CTX_SCHEMA,
    CTX_TOOL,
    JS_TOOL,
    N_SEQ,
    PY_TOOL,
    RUNNER_TOKEN,
    TOKEN,
    create,
    ctx_round_trip,
    free_port,
    invoke_url,
    pct,
    sequential,
    start_runner,
    start_service,
    stop,
    workspace,
)

GOAL = "TCP adds <= 0.3 ms p50"


def shape(tmp: Path, remote: bool, kind: str) -> dict[str, object]:
    """Sequential Python and JavaScript calls and the ctx round trip on a service whose
    runner is its own (embedded) or a ``toolkiln runner`` over loopback TCP."""
    runner = None
    extra: dict[str, str] = {}
    with databases.fresh(kind) as url:
        try:
            if remote:
                rport = free_port()
                runner = start_runner(tmp / "runner" / "data", rport)
                extra = {
                    "TOOLKILN_RUNNERS": f"127.0.0.1:{rport}",
                    "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
                }
            port = free_port()
            proc = start_service(tmp / "api", port, extra, database_url=url)
            try:
                c = Conn(port, TOKEN)
                ws = workspace(c)
                py = invoke_url(create(c, ws, "bench-python", "python", PY_TOOL))
                js = invoke_url(create(c, ws, "bench-js", "javascript", JS_TOOL))
                loop = create(c, ws, "bench-ctx", "python", CTX_TOOL, input_schema=CTX_SCHEMA)
                out: dict[str, object] = {
                    "python": sequential(c, py, {"input": {}}, N_SEQ),
                    "javascript": sequential(c, js, {"input": {}}, N_SEQ),
                    "ctx_ms": ctx_round_trip(c, invoke_url(loop)),
                }
                c.close()
                return out
            finally:
                stop(proc)
        finally:
            if runner is not None:
                stop(runner)


def _added(embedded: dict[str, object], tcp: dict[str, object], name: str) -> float:
    """What the runner over TCP added to the p50 (ms)."""
    a, b = embedded[name], tcp[name]
    assert isinstance(a, list) and isinstance(b, list)
    return pct(b, 0.5) - pct(a, 0.5)


def _cell(embedded: dict[str, object], tcp: dict[str, object], name: str, p: float) -> str:
    if name == "ctx_ms":
        e, t = embedded[name], tcp[name]
        assert isinstance(e, float) and isinstance(t, float)
        return f"{e:.3f} / {t:.3f} ms ({t - e:+.3f})"
    a, b = embedded[name], tcp[name]
    assert isinstance(a, list) and isinstance(b, list)
    return f"{pct(a, p):.2f} / {pct(b, p):.2f} ms ({pct(b, p) - pct(a, p):+.2f})"


def shapes_table(kinds: list[str]) -> list[str]:
    """Per database: embedded / TCP (TCP - embedded), for each figure."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-shapes-") as tmp:
        for kind in kinds:
            embedded = shape(Path(tmp) / kind / "embedded", remote=False, kind=kind)
            tcp = shape(Path(tmp) / kind / "tcp", remote=True, kind=kind)
            found[kind] = (embedded, tcp)
    labels = [databases.LABELS[k] for k in kinds]
    rows = [
        "| runner shapes: embedded (Unix socket) / loopback TCP (TCP - embedded) | "
        + " | ".join(labels)
        + " | goal |",
        "|---" * (len(kinds) + 2) + "|",
    ]
    figures = (
        ("Python tool over HTTP, p50", "python", 0.5, GOAL),
        ("Python tool over HTTP, p99", "python", 0.99, ""),
        ("JavaScript tool over HTTP, p50", "javascript", 0.5, GOAL),
        ("JavaScript tool over HTTP, p99", "javascript", 0.99, ""),
        ("one `ctx.tools.calculate` round trip", "ctx_ms", 0.5, ""),
    )
    for what, name, p, goal in figures:
        cells = [_cell(*found[kind], name, p) for kind in kinds]
        if goal:
            met = [databases.LABELS[k] for k in kinds if _added(*found[k], name) <= 0.3]
            goal += f": met on {', '.join(met)}" if met else ": not met"
        rows.append(f"| {what} | {' | '.join(cells)} | {goal} |")
    return rows
