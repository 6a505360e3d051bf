"""The CPU-time backstop (RLIMIT_CPU) is a call's, never the sum of earlier calls': a
JavaScript worker serves several calls in one process, and with the per-call limit set for
its whole life, a call that used 0.8 s of CPU was killed as a counted ``timeout`` ("cpu time
limit") because the worker's earlier calls had used the rest. Shown with a 2 s limit (the
service's is 31 s: a JavaScript tool using ~1 s a call lost every ~31st call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.links import NoCtx
from toolkiln.domain.execution import RunRequest
from toolkiln.sandbox.packages import JsPackageStore
from toolkiln.sandbox.runner import Limits, Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox

BUSY = (
    "function main(p) {\n"
    "  const end = Date.now() + p.ms; let n = 0;\n"
    "  while (Date.now() < end) n++;\n"
    "  return { message: 'busy ' + n };\n"
    "}\n"
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = javascript_sandbox(
        JsPackageStore(Path(tmp_path_factory.mktemp("js-cpu"))),
        warm=1,
        name="js-cpu",
        limits=Limits(max_cpu_s=2),
    )
    yield sb
    sb.close()


def test_cpu_time_of_earlier_calls_never_ends_a_later_one(sandbox: Sandbox) -> None:
    outcomes = []
    for _ in range(5):  # 0.8 s each: together past the 2 s limit, one alone far under it
        req = RunRequest("javascript", BUSY, "main", {"ms": 800}, 1900, {}, workspace_id="ws")
        out = sandbox.run(req, NoCtx())
        outcomes.append((out.kind, out.details))
    assert outcomes == [("return", {})] * 5, outcomes
