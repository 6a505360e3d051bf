"""Two workspaces on one service: nothing of one workspace's call reaches the other's.

The JavaScript runtime keeps long-lived workers, so these tests run against a service with
ONE worker: every call of both workspaces lands on the same process, the worst case for a
channel that could go out of step between calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import own_service
from tests.security.tenants import Tenant, tenant
from toolkiln.app import Runtime

TOKEN = "tk_cross-workspace-suite-admin"
A_SECRET = "A-SECRET-8d1f0c"

# A reply to ctx larger than the worker's frame cap: the nested tool's result is under the
# result cap, but message + rawData + llm together are not.
BIG = "def handle(input, ctx):\n    return 'x' * 600_000\n"
DESYNC = {
    "javascript": (
        "async function handle(input, ctx) {\n"
        "  let first;\n"
        "  try { first = await ctx.tools.big({}); } catch (e) { first = {link: e.message}; }\n"
        "  return first && first.error;\n"
        "}\n"
    ),
    "python": (
        "def handle(input, ctx):\n"
        "    try:\n"
        "        first = ctx.tools.big({})\n"
        "    except ctx.LinkError as exc:\n"
        "        first = {'link': str(exc)}\n"
        "    return first.get('error')\n"
    ),
}
SECRET_TOOL = (
    "async function main(p, ctx) {\n"
    "  await ctx.audit('from-a', { secret: p.secret });\n"
    "  return { message: 'mine', rawData: { secret: p.secret } };\n"
    "}\n"
)


@dataclass
class Pair:
    runtime: Runtime
    a: Tenant
    b: Tenant


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data_dir = tmp_path_factory.mktemp("cross-workspace")
    with own_service(data_dir, TOKEN, sandbox_js_workers=1) as (rt, client, _):
        a, b = tenant(rt, client, "tenant-a"), tenant(rt, client, "tenant-b")
        a.tool("big", BIG, language="python")
        yield Pair(rt, a, b)


@pytest.mark.parametrize("language", ["javascript", "python"])
def test_an_oversized_ctx_reply_leaves_nothing_for_the_next_call(pair: Pair, language: str) -> None:
    a, b = pair.a, pair.b
    desync = a.tool(f"desync-{language}", DESYNC[language], language=language)
    secret = a.tool(f"secret-{language}", SECRET_TOOL)
    mine = b.tool(f"mine-{language}", "function main(p) { return { message: 'b-' + p.n } }")

    first = a.invoke(desync)
    a_second = a.invoke(secret, {"secret": A_SECRET})
    b_first = b.invoke(mine, {"n": 1})
    b_second = b.invoke(mine, {"n": 2})
    assert A_SECRET not in str(b_first) and A_SECRET not in str(b_second)
    assert a_second["status"] == "ok" and a_second["raw_data"] == {"secret": A_SECRET}, a_second
    assert b_first["status"] == "ok" and b_first["message"] == "b-1", b_first
    assert b_second["status"] == "ok" and b_second["message"] == "b-2", b_second["error"]
    # A's ctx requests are A's: audited on A's call, never run as B's.
    a_events = [row["event"] for row in a.stored(a_second["tool_call_id"])["audit"]]
    assert "custom.from-a" in a_events
    for call in (b_first, b_second):
        rows = b.stored(call["tool_call_id"])["audit"]
        assert [row["event"] for row in rows] == ["tool.invoked"], rows
        assert A_SECRET not in str(rows)
    # The host never sends a reply over the jail's cap: the code reads an error envelope.
    assert first["status"] == "ok" and first["raw_data"] == "too_large", first


LOOP_LEAVER = (
    "import asyncio\n"
    "async def handle(input, ctx):\n"
    "    loop = asyncio.get_running_loop()\n"
    "    loop.tk_secret = input['secret']\n"
    "    loop.call_later(0.2, print, input['secret'])\n"
    "    asyncio.ensure_future(asyncio.sleep(30))\n"
    "    return 'left'\n"
)
LOOP_LOOKER = (
    "import asyncio\n"
    "async def handle(input, ctx):\n"
    "    loop = asyncio.get_running_loop()\n"
    "    await asyncio.sleep(0.3)\n"
    "    return {'secret': getattr(loop, 'tk_secret', None),\n"
    "            'others': len(asyncio.all_tasks(loop)) - 1}\n"
)


def test_the_event_loop_made_ahead_is_each_calls_own(pair: Pair) -> None:
    """A Python child makes its event loop before its request (pyrunner._prepare_loop):
    what a call leaves on its loop (an attribute, a timer, a pending task) is never on
    another call's, of its own workspace or another's."""
    a, b = pair.a, pair.b
    leaver = a.tool("loop-leaver", LOOP_LEAVER, language="python")
    a_looker = a.tool("loop-looker", LOOP_LOOKER, language="python")
    b_looker = b.tool("loop-looker", LOOP_LOOKER, language="python")
    for _ in range(3):
        left = a.invoke(leaver, {"secret": A_SECRET})
        assert left["status"] == "ok" and left["raw_data"] == "left", left
        for tenant_, looker in ((a, a_looker), (b, b_looker)):
            seen = tenant_.invoke(looker)
            assert seen["status"] == "ok", seen
            assert seen["raw_data"] == {"secret": None, "others": 0}, seen
            assert A_SECRET not in str(tenant_.stored(seen["tool_call_id"]))


def worker_pids(rt: Runtime) -> set[int]:
    js = rt.sandboxes["javascript"]
    low = int(js.uids.first)
    high = low + int(js.uids.count)
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if low <= entry.stat().st_uid < high:
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


def owned_by(rt: Runtime, workspace_id: str) -> set[int]:
    """Host pids of the idle JavaScript workers that serve ``workspace_id``."""
    js = rt.sandboxes["javascript"]
    return {c.global_pid for c in js.template.idle() if c.owner == workspace_id}


def test_a_worker_that_served_one_workspace_never_serves_another(pair: Pair) -> None:
    """Even an escape from V8 into its worker process must not reach another workspace's
    calls: a worker serves one workspace for its whole life."""
    a, b = pair.a, pair.b
    js = pair.runtime.sandboxes["javascript"]
    a_tool = a.tool("a-owner", "function main(p) { return { message: 'a' } }")
    b_tool = b.tool("b-owner", "function main(p) { return { message: 'b' } }")
    assert a.invoke(a_tool)["message"] == "a"
    retired = js.runtime.retired_for_another_workspace
    assert a.invoke(a_tool)["message"] == "a"
    assert (
        js.runtime.retired_for_another_workspace == retired
    )  # the same workspace keeps its worker
    # A's own workers, not the spare: B claims that one (it may have dropped to its uid by
    # now, since V8 starts in the template and a new worker is ready within milliseconds).
    a_workers = owned_by(pair.runtime, a.workspace_id)
    assert a_workers and a_workers <= worker_pids(pair.runtime)
    assert b.invoke(b_tool)["message"] == "b"
    assert js.runtime.retired_for_another_workspace == retired + 1
    deadline = time.monotonic() + 10  # killed at once; gone once the template reaps it
    while a_workers & worker_pids(pair.runtime):
        assert time.monotonic() < deadline, "A's worker is still alive"
        time.sleep(0.01)
    assert a.invoke(a_tool)["message"] == "a"
    assert js.runtime.retired_for_another_workspace == retired + 2


RANDOM_TOOL = (
    "function main(p) {\n"
    "  const xs = [Math.random(), Math.random(), Math.random()];\n"
    "  return { message: 'r', rawData: xs };\n"
    "}\n"
)


def test_workers_of_one_started_engine_share_no_random_state(pair: Pair) -> None:
    """V8 starts once, in the template, and every worker is a fork of it: what V8 seeded
    at start must not make two workers (two workspaces) or two isolates of one worker draw
    the same numbers. Each isolate seeds itself afresh."""
    a, b = pair.a, pair.b
    a_tool = a.tool("a-random", RANDOM_TOOL)
    b_tool = b.tool("b-random", RANDOM_TOOL)
    drawn = []
    for _ in range(3):
        for who, tool in ((a, a_tool), (b, b_tool)):
            out = who.invoke(tool)
            assert out["status"] == "ok", out
            drawn.append(tuple(out["raw_data"]))
    assert len(set(drawn)) == len(drawn), drawn


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_the_javascript_template_forks_with_one_thread(pair: Pair) -> None:
    """A fork carries only the thread that forks: V8 started in the template must leave no
    thread of its own there, or workers would inherit an engine missing one. (Workers run
    threads of their own once they make isolates; the template never does.)"""
    js = pair.runtime.sandboxes["javascript"]
    outer = js.template.pid  # waits for the template, PID 1 of the namespaces, its one child
    assert outer is not None
    inner = [int(p) for p in Path(f"/proc/{outer}/task/{outer}/children").read_text().split()]
    assert len(inner) == 1, inner
    assert _threads(outer) == 1 and _threads(inner[0]) == 1
    workers = Path(f"/proc/{inner[0]}/task/{inner[0]}/children").read_text().split()
    assert workers  # the template forked the workers this test's module used
