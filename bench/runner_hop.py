"""The hop to a runner alone: runs against a runner whose sandbox answers at once, in
alternating rounds, with the CPU each side spent per run.

``python bench/runner_hop.py [NAME=CLIENT_PY[@SERVER_OPTIONS_JSON] ...]``: each NAME is a
``runners/client.py`` (this checkout's, another checkout's, or an edited copy) measured
against runners of its own on a Unix socket and on loopback TCP (this checkout's
``runners/server.py``, with the given extra gRPC server options); with no argument, this
checkout's client. ``BENCH_CTX`` ctx calls per run (default 0; with none, each run is
also sent one way, ``RunOneWay``, to clients that know it), ``BENCH_ROUNDS`` x
``BENCH_PER_ROUND`` runs per shape. CPU per run (user + system, from /proc) is the figure to
compare on a busy machine: it moves less with the machine's load than the times do. Not part
of the test run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from service import free_port, pct

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "8"))
PER_ROUND = int(os.environ.get("BENCH_PER_ROUND", "200"))
CTX = int(os.environ.get("BENCH_CTX", "0"))
THIS = Path(__file__).resolve().parents[1] / "src" / "toolkiln" / "runners" / "client.py"


def serve(listen: str, options: list[list[Any]]) -> None:
    """A runner whose one sandbox admits the run, makes ``input["n"]`` ctx calls, returns."""
    from toolkiln.domain.execution import RunOutcome
    from toolkiln.runners import server

    class Fair:
        def waiting(self) -> int:
            return 0

    class Sandbox:
        fair = Fair()

        def at_once(self, req: Any) -> bool:
            return True

        def run(self, req: Any, link: Any) -> RunOutcome:
            if not link.admit():
                return RunOutcome("not_admitted")
            for _ in range(int(req.input.get("n", 0))):
                link.call("calculate", {"expression": "1+1"})
            return RunOutcome("return", value={"message": "ok"})

    class Host:
        sandboxes = {"python": Sandbox()}

        def enter(self, share: str) -> object:
            return object()

        def leave(self, share: str) -> None:
            pass

        def admitted(self) -> None:
            pass

    server.SERVER_OPTIONS = server.SERVER_OPTIONS + [(str(k), v) for k, v in options]
    grpc_server, _ = server.make_server(server.RunnerService(Host()), listen, "bench")  # type: ignore[arg-type]
    print("listening", flush=True)
    grpc_server.wait_for_termination()


class Link:
    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: Any) -> Any:
        return 2

    def audit(self, event: str, data: Any) -> str | None:
        return None


def load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_client_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    from toolkiln.runners import wire

    given = dict(arg.split("=", 1) for arg in sys.argv[1:]) or {"this": str(THIS)}
    tmp = Path(tempfile.mkdtemp(prefix="toolkiln-hop-"))
    procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
    clients: dict[tuple[str, str], Any] = {}
    try:
        for name, spec in given.items():
            path, _, options = spec.partition("@")
            module = load(name, path)
            where = {"unix": f"unix:{tmp}/{name}.sock", "tcp": f"127.0.0.1:{free_port()}"}
            for shape, address in where.items():
                argv = [sys.executable, __file__, "--serve", address, options or "[]"]
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
                assert proc.stdout is not None
                proc.stdout.readline()
                procs[name, shape] = proc
                clients[name, shape] = module.RunnerClient(address, "bench")
        start = wire.Start("python", "", "main", {"n": CTX}, 5000, {}, "w", "c", "s")

        def one(client: Any) -> float:
            began = time.perf_counter()
            key = secrets.token_hex(8) if CTX == 0 else ""
            outcome = client.run(dataclasses.replace(start, key=key), Link())
            assert outcome.kind == "return", outcome
            return (time.perf_counter() - began) * 1000

        times: dict[tuple[str, str], list[float]] = {key: [] for key in clients}
        cpu = {key: [0.0, 0.0] for key in clients}
        for client in clients.values():
            for _ in range(50):
                one(client)
        for _ in range(ROUNDS):
            for key, client in clients.items():
                mine, theirs = own_cpu_s(), cpu_s(procs[key].pid)
                times[key] += [one(client) for _ in range(PER_ROUND)]
                cpu[key][0] += own_cpu_s() - mine
                cpu[key][1] += cpu_s(procs[key].pid) - theirs
    finally:
        for proc in procs.values():
            proc.terminate()
    print(
        f"load average {os.getloadavg()[0]:.1f}; {ROUNDS} rounds x {PER_ROUND} runs, "
        f"{CTX} ctx calls each, alternating"
    )
    print("| client | runner | p50 / p90 / p99 | CPU per run, API side / runner |")
    print("|---|---|---|---|")
    for (name, shape), samples in times.items():
        api, runner = (s / len(samples) * 1000 for s in cpu[name, shape])
        print(
            f"| {name} | {shape} | {pct(samples, 0.5):.2f} / {pct(samples, 0.9):.2f} / "
            f"{pct(samples, 0.99):.2f} ms | {api:.2f} / {runner:.2f} ms |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], json.loads(sys.argv[3]))
    else:
        main()
