"""Cost of one ctx.tools.calculate round trip from sandboxed Python code (in-process service,
no HTTP): an invocation making N calls minus one making none, divided by N."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from toolkiln.app import build
from toolkiln.config import Settings
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.invoke import CallContext

N = 50
LOOP = "def handle(input, ctx):\n    for i in range(input['n']):\n        ctx.tools.calculate({'expression': '1+1'})\n    return 1\n"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-ctx-") as tmp:
        rt = build(Settings(data_dir=Path(tmp)))
        try:
            rt.services.access.bootstrap("bench")
            who = rt.services.access.authenticate("bench")
            tool = rt.services.tools.create(
                who,
                who.workspace_id,
                ToolDraft(
                    name="loop", language="python", code=LOOP, input_schema={"type": "object"}
                ),
            )
            invoke = rt.services.invoke

            def timed(n: int) -> float:
                t = time.perf_counter()
                res = invoke.invoke(who, tool.id, {"n": n}, CallContext())
                assert res.status == "ok", res
                return (time.perf_counter() - t) * 1000

            for _ in range(5):
                timed(N)
            with_calls = [timed(N) for _ in range(40)]
            without = [timed(0) for _ in range(40)]
        finally:
            rt.close()
    per_call = (statistics.median(with_calls) - statistics.median(without)) / N
    print(
        f"invocation with {N} ctx.tools.calculate calls: median {statistics.median(with_calls):.2f} ms"
    )
    print(
        f"invocation with no ctx call:                 median {statistics.median(without):.2f} ms"
    )
    print(f"one ctx.tools.calculate round trip:          {per_call * 1000:.0f} us")


if __name__ == "__main__":
    main()
