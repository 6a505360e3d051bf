"""The JavaScript sandbox on its own: what a worker prepares ahead serves one call only, and a
call returning at once (no promise) keeps the semantics of an awaited one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox.links import NoCtx
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.sandbox import jail
from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.javascript_runtime import JavaScriptRuntime
from toolkiln.sandbox.packages import JsPackageStore
from toolkiln.sandbox.pool import WarmChild
from toolkiln.sandbox.runner import Sandbox

# jail/jsrunner.py runs as a top-level module in the jail (it imports its siblings so): read
# its cap from the source rather than importing it into the service's package.
MAX_ANSWERS = int(
    re.search(
        r"^MAX_ANSWERS = (\d+)",
        (Path(jail.__file__).parent / "jsrunner.py").read_text(),
        re.MULTILINE,
    ).group(1)  # type: ignore[union-attr]
)


class OneWorker(JavaScriptRuntime):
    """Records which worker served each call (one workspace, so its own worker serves all)."""

    served: list[int]

    def take(self, req: RunRequest, timeout: float) -> WarmChild:
        child = super().take(req, timeout)
        self.served.append(child.pid)
        return child


class Recording(NoCtx):
    """Answers every ctx call with a fixed value and keeps what the code sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.rows: list[tuple[str, object]] = []

    def call(self, name: str, payload: object) -> object:
        self.calls.append((name, payload))
        return {"answer": 42}

    def audit(self, event: str, data: object) -> None:
        self.rows.append((event, data))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = one_worker(JsPackageStore(tmp_path_factory.mktemp("js")), name="js-one")
    yield sb
    sb.close()


def one_worker(store: JsPackageStore, name: str) -> Sandbox:
    runtime = OneWorker()
    runtime.served = []
    return Sandbox(runtime, store, warm=1, name=name)


def served(sb: Sandbox) -> list[int]:
    assert isinstance(sb.runtime, OneWorker)
    return sb.runtime.served


def run(
    sb: Sandbox, code: str, link: Any = None, entry: str = "main", call: str = ""
) -> RunOutcome:
    context = {"toolCallId": call} if call else {}
    req = RunRequest("javascript", code, entry, {}, 5000, context, workspace_id="ws-1")
    return sb.run(req, link or NoCtx())


PLANT = """function main(params, ctx) {
  console.log('secret of the first call');
  globalThis.planted = 1;
  Object.prototype.polluted = 'yes';
  Object.prototype.then = function (ok) { ok('hijacked'); };
  Array.prototype.map = () => 'hijacked';
  new Promise(() => {});
  return { message: 'planted' };
}"""

LOOK = """function main(params, ctx) {
  const seen = [typeof globalThis.planted, ({}).polluted, typeof ({}).then,
                [1].map((x) => x + 1)[0], ctx.toolCallId];
  return { message: JSON.stringify(seen) };
}"""


def test_a_workers_first_call_sees_nothing_of_its_rehearsal(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A new worker runs a call of its own first (jsrunner._rehearse: a ``main`` returning
    'ok'); the first caller's isolate is a new one, with no ``main`` but its own."""
    sb = one_worker(JsPackageStore(tmp_path_factory.mktemp("js-r")), name="js-rehearsed")
    try:
        code = "function handle(input, ctx) { return [typeof main, typeof globalThis.__tk_seen]; }"
        first = run(sb, code, entry="handle")
        assert first.kind == "return" and first.value == ["undefined", "undefined"], first
        assert first.stdout == "" and first.ctx_calls == 0
    finally:
        sb.close()


def test_nothing_of_a_call_reaches_the_next_on_the_same_worker(sandbox: Sandbox) -> None:
    first = run(sandbox, PLANT, call="call-1")
    # Object.prototype.then makes the returned object a thenable: it is awaited, as before.
    assert first.kind == "return" and first.value == "hijacked", first
    second = run(sandbox, LOOK, call="call-2")
    assert second.kind == "return", second
    assert second.value == {"message": '["undefined",null,"undefined",2,"call-2"]'}
    assert "secret" not in second.stdout
    assert served(sandbox)[-2] == served(sandbox)[-1]  # one worker, two isolates


def test_a_ctx_call_not_awaited_by_a_sync_entry_still_runs(sandbox: Sandbox) -> None:
    link = Recording()
    code = (
        "function main(params, ctx) {\n"
        "  ctx.audit('started', { n: 1 });\n"
        "  ctx.tools.lookup({ id: 7 });\n"
        "  return { message: 'ok' };\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return" and out.value == {"message": "ok"}, out
    assert link.rows == [("started", {"n": 1})]
    assert link.calls == [("lookup", {"id": 7})]


def test_a_ctx_call_a_microtask_issues_after_the_return_still_runs(sandbox: Sandbox) -> None:
    link = Recording()
    code = (
        "function main(params, ctx) {\n"
        "  Promise.resolve().then(() => ctx.audit('after', null))\n"
        "    .then(() => console.log('audited'));\n"
        "  return { message: 'ok' };\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return" and out.value == {"message": "ok"}, out
    assert link.rows == [("after", None)]


class Numbered(Recording):
    """Answers each ctx call with its name and its place in the order the calls were made."""

    def call(self, name: str, payload: object) -> object:
        self.calls.append((name, payload))
        return {"name": name, "nth": len(self.calls)}


def test_ctx_calls_are_made_in_order_including_parallel_and_chained_ones(
    sandbox: Sandbox,
) -> None:
    """A ctx call waits in the isolate's queue until the worker takes it (jsrunner.SETUP):
    awaited one by one, together (Promise.all), chained in a continuation, or issued after
    the entry's promise settled, each is made once, in the order the code made them, and
    its answer reaches the code that made it."""
    link = Numbered()
    code = (
        "async function main(params, ctx) {\n"
        "  const a = await ctx.tools.first({ n: 1 });\n"
        "  const [b, c] = await Promise.all([ctx.tools.second({}), ctx.tools.third({})]);\n"
        "  const d = await ctx.tools.fourth({}).then((r) => ctx.tools.fifth({ after: r.nth }));\n"
        "  Promise.resolve().then(() => ctx.audit('late', { seen: d.nth }));\n"
        "  return { a, b, c, d };\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return", out
    assert out.value == {
        "a": {"name": "first", "nth": 1},
        "b": {"name": "second", "nth": 2},
        "c": {"name": "third", "nth": 3},
        "d": {"name": "fifth", "nth": 5},
    }
    assert link.calls == [
        ("first", {"n": 1}),
        ("second", {}),
        ("third", {}),
        ("fourth", {}),
        ("fifth", {"after": 4}),
    ]
    assert link.rows == [("late", {"seen": 5})]


def test_a_ctx_call_whose_input_json_cannot_spell_throws_where_it_is_made(
    sandbox: Sandbox,
) -> None:
    link = Numbered()
    code = (
        "function main(params, ctx) {\n"
        "  try { ctx.tools.bad({ n: 1n }); } catch (e) { return { threw: e.name }; }\n"
        "  return { threw: null };\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return" and out.value == {"threw": "TypeError"}, out
    assert link.calls == []


def test_a_ctx_call_of_what_json_cannot_spell_is_refused_without_being_made(
    sandbox: Sandbox,
) -> None:
    link = Numbered()
    code = (
        "async function main(params, ctx) {\n"
        "  try { await ctx.tools.fn(() => 1); } catch (e) { return [e.name, e.message]; }\n"
        "  return null;\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return", out
    assert out.value == ["TypeError", "a ctx call takes what JSON can spell"]
    assert link.calls == []


def test_ctx_calls_that_queue_each_other_without_end_end_the_run_at_the_hosts_cap(
    sandbox: Sandbox,
) -> None:
    """Each answer queues the next call: the host ends the run at its cap of ctx frames (not
    at the call's timeout) and the next call is served. (The worker itself stops answering at
    MAX_ANSWERS, above the host's cap, rather than spin on calls that can only fail.)"""
    assert MAX_ANSWERS > protocol.Caps().ctx_frames
    code = (
        "function main(params, ctx) {\n"
        "  const again = () => ctx.audit('x', null).then(again, again);\n"
        "  again();\n"
        "  return { message: 'ok' };\n"
        "}"
    )
    out = run(sandbox, code, Recording())
    assert (out.kind, out.error_type) == ("exception", "CtxLimitError"), out
    after = run(sandbox, "function main() { return { message: 'next' } }", Recording())
    assert after.kind == "return" and after.value == {"message": "next"}, after


def test_an_async_entry_resolved_at_once_still_makes_its_ctx_calls_and_reports_their_logs(
    sandbox: Sandbox,
) -> None:
    """An async entry's value is read once its queued ctx calls are answered (jsrunner
    ``__tk_done``): a call it did not await is made, and what its answer logged is reported."""
    link = Numbered()
    code = (
        "async function main(params, ctx) {\n"
        "  ctx.tools.later({}).then((r) => console.log('answered', r.nth));\n"
        "  return { message: 'ok' };\n"
        "}"
    )
    out = run(sandbox, code, link)
    assert out.kind == "return" and out.value == {"message": "ok"}, out
    assert link.calls == [("later", {})]
    assert out.stdout == "answered 1\n"


def test_a_value_returned_at_once_is_read_after_the_microtasks_it_queued(
    sandbox: Sandbox,
) -> None:
    code = (
        "function main() {\n"
        "  const r = { message: 'early' };\n"
        "  Promise.resolve().then(() => { r.message = 'late'; console.log('logged later'); });\n"
        "  return r;\n"
        "}"
    )
    out = run(sandbox, code)
    assert out.kind == "return" and out.value == {"message": "late"}, out
    assert out.stdout == "logged later\n"


def test_errors_and_async_entries_on_a_prepared_isolate(sandbox: Sandbox) -> None:
    thrown = run(sandbox, "function main() { throw new TypeError('bad input') }")
    assert (thrown.kind, thrown.error_type, thrown.message) == (
        "exception",
        "TypeError",
        "bad input",
    )
    missing = run(sandbox, "function handle(input, ctx) { return 1 }")
    assert (missing.error_type, missing.message) == ("ReferenceError", "main is not defined")
    looped = run(sandbox, "const handle = async (input) => ({ message: 'later' })", entry="handle")
    assert looped.kind == "return" and looped.value == {"message": "later"}, looped
    odd = run(sandbox, "function main() { return { n: 1n } }")
    assert odd.kind == "unserializable", odd


def test_an_isolate_holds_none_of_the_engine_packages_timer_globals(sandbox: Sandbox) -> None:
    """The isolate is made without mini-racer's setTimeout script (the prelude removed what
    it installed, but for its own variable): a new engine version that drops the private
    context maker fails here rather than quietly costing its ~0.35 ms per isolate again."""
    code = (
        "function main() { return { message: [typeof setTimeout, typeof __timer_manager,"
        " typeof __TimerManager, typeof SharedArrayBuffer].join(' ') } }"
    )
    out = run(sandbox, code)
    assert out.value == {"message": "undefined undefined undefined undefined"}, out


HOLD = (
    "function main(p) {\n"
    "  globalThis.kept = new Uint8Array(120 * 1024 * 1024).fill(1);\n"
    "  const t = Date.now(); while (Date.now() - t < 300) {}\n"
    "  return { message: 'held ' + globalThis.kept.length };\n"
    "}\n"
)


def test_a_call_does_not_run_beside_the_memory_of_the_call_before(sandbox: Sandbox) -> None:
    """The isolate of the call before is closed before the next call runs, even when that
    call was already waiting for the worker: its memory (120 MB here, under the worker's
    256 MB cap) never counts against the next call (120 MB more)."""
    import threading

    outcomes: list[RunOutcome] = []
    first = threading.Thread(target=lambda: outcomes.append(run(sandbox, HOLD)))
    first.start()
    second = run(sandbox, HOLD)  # queued behind the first (one call at a time here)
    first.join(timeout=30)
    assert [o.kind for o in outcomes] == ["return"], outcomes
    assert second.kind == "return", second
