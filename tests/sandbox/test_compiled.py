"""Python code compiled once per workspace and source (sandbox/compiled.py): later calls
load it and behave as calls that compiled it, and what is kept holds nothing of a call."""

from __future__ import annotations

import base64
import marshal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.sandbox.links import NoCtx
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.sandbox import compiled as compiled_module
from toolkiln.sandbox.compiled import Compiled
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox

SECRET = "call-secret-5b0e2f"
TOOL = (
    "import json\n"
    "def helper(x):\n"
    "    return {'seen': x}\n"
    "def handle(input, ctx):\n"
    "    if input.get('fail'):\n"
    "        raise ValueError('bad input')  # line 6\n"
    "    return helper(input)\n"
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=2, name="py-compiled")
    yield sb
    sb.close()


def run(sb: Sandbox, code: str, payload: dict[str, Any], ws: str = "ws-a") -> RunOutcome:
    req = RunRequest("python", code, "handle", payload, 5000, workspace_id=ws)
    return sb.run(req, NoCtx())


def compiled_for(sb: Sandbox, ws: str, code: str) -> str | None:
    """The kept text once the background compile asked for has ended (within 10 s)."""
    key = Compiled.key(ws, code)
    deadline = time.monotonic() + 10
    while sb.runtime.compiled.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return sb.runtime.compiled.get(key)


def test_code_seen_twice_is_compiled_once_and_later_calls_behave_the_same(
    sandbox: Sandbox,
) -> None:
    first = [run(sandbox, TOOL, {"n": i, "secret": SECRET}) for i in range(2)]
    made = compiled_for(sandbox, "ws-a", TOOL)
    assert made is not None
    later = run(sandbox, TOOL, {"n": 2, "secret": SECRET})
    for i, out in enumerate([*first, later]):
        assert out.kind == "return" and out.value == {"seen": {"n": i, "secret": SECRET}}, out
    failed = run(sandbox, TOOL, {"fail": True})
    assert failed.kind == "exception" and failed.error_type == "ValueError", failed
    assert failed.line == 6  # the compiled code keeps the source's lines


# A tool that tries to plant its input in the compiled code later calls load: in its own
# process it makes every compile produce code that returns that input.
PLANTER = (
    "import base64, marshal\n"
    "def handle(input, ctx):\n"
    "    planted = compile(f'def handle(i, c):\\n    return {input!r}\\n', '<tool>', 'exec')\n"
    "    real = marshal.dumps\n"
    "    marshal.dumps = lambda code, *a: real(planted, *a)\n"
    "    return 'planted'\n"
)


def test_what_is_kept_holds_nothing_of_any_call(sandbox: Sandbox) -> None:
    """The compile child is given the source alone and runs none of it: a call's input (the
    secret) is in no byte of what later calls are handed, and a call cannot change what
    they load, even when its code tampers with the compiler of its own process."""
    for i in range(2):
        out = run(sandbox, PLANTER, {"secret": f"{SECRET}-{i}"}, ws="ws-s")
        assert out.kind == "return" and out.value == "planted", out
    made = compiled_for(sandbox, "ws-s", PLANTER)
    assert made is not None
    raw = base64.b64decode(made)
    assert SECRET.encode() not in raw and b"ws-s" not in raw
    assert marshal.loads(raw).co_filename == "<tool>"
    later = run(sandbox, PLANTER, {"other": 1}, ws="ws-s")
    assert later.kind == "return" and later.value == "planted", later


def test_identical_code_in_two_workspaces_is_kept_for_each(sandbox: Sandbox) -> None:
    """Keyed by workspace: bytes kept for one workspace's code never reach another's calls,
    even for the very same source (here: A's entry replaced by code that says so)."""
    code = "def handle(input, ctx):\n    return 'honest'\n"
    poisoned = base64.b64encode(
        marshal.dumps(compile("def handle(input, ctx):\n    return 'A-only'\n", "<tool>", "exec"))
    ).decode()
    sandbox.runtime.compiled.done(Compiled.key("ws-a", code), poisoned)
    assert run(sandbox, code, {}, ws="ws-a").value == "A-only"  # the host's choice, for A
    for _ in range(3):
        assert run(sandbox, code, {}, ws="ws-b").value == "honest"


def test_bytes_that_do_not_load_as_the_tools_code_are_ignored(sandbox: Sandbox) -> None:
    code = "def handle(input, ctx):\n    return 'compiled here'\n"
    other_file = base64.b64encode(marshal.dumps(compile("x = 1", "<other>", "exec"))).decode()
    for ws, text in [("ws-g", "not base64 at all!"), ("ws-h", "AAAA"), ("ws-i", other_file)]:
        sandbox.runtime.compiled.done(Compiled.key(ws, code), text)
        out = run(sandbox, code, {}, ws=ws)
        assert out.kind == "return" and out.value == "compiled here", (ws, out)


def test_a_syntax_error_is_never_kept_and_is_reported_each_time(sandbox: Sandbox) -> None:
    code = "def handle(input, ctx):\n    return (\n"
    for _ in range(3):
        out = run(sandbox, code, {}, ws="ws-x")
        assert out.kind == "exception" and out.error_type == "SyntaxError", out
    deadline = time.monotonic() + 5
    while Compiled.key("ws-x", code) in sandbox.runtime.compiled._pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sandbox.runtime.compiled.get(Compiled.key("ws-x", code)) is None
    assert not sandbox.runtime.compiled.wanted(
        Compiled.key("ws-x", code)
    )  # and not asked for again
    assert not sandbox.runtime.compiled.wanted(Compiled.key("ws-x", code))


def test_the_cache_asks_on_the_second_sighting_and_keeps_its_caps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = Compiled()
    a, b = Compiled.key("ws-1", "x = 1"), Compiled.key("ws-2", "x = 1")
    assert a != b
    assert not cache.wanted(a) and cache.wanted(a) and not cache.wanted(a)  # once in flight
    cache.done(a, "text")
    assert cache.get(a) == "text" and cache.get(b) is None and not cache.wanted(a)
    cache.done(b, "x" * (compiled_module.MAX_ENTRY_CHARS + 1))  # over the cap: not kept
    assert cache.get(b) is None
    assert not cache.wanted(b) and not cache.wanted(b)  # and not asked for again
    monkeypatch.setattr(compiled_module, "MAX_ENTRIES", 3)
    for i in range(5):
        cache.done(Compiled.key("ws-1", f"code {i}"), f"t{i}")
    assert len(cache) == 3 and cache.get(a) is None  # the least recently used went first


def test_a_compile_takes_no_share_of_its_workspace(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compile runs outside the fair shares (sandbox/fair.py): with the workspace at its
    cap it neither waits behind the workspace's calls nor makes one wait."""
    turns: list[str] = []
    acquire = sandbox.fair.acquire

    def counted(workspace_id: str, deadline: float) -> bool:
        turns.append(workspace_id)
        return acquire(workspace_id, deadline)

    monkeypatch.setattr(sandbox.fair, "acquire", counted)
    code = "def handle(input, ctx):\n    return 'shared fairly'\n"
    for _ in range(2):
        assert run(sandbox, code, {}, ws="ws-f").value == "shared fairly"
    assert compiled_for(sandbox, "ws-f", code) is not None
    assert turns == ["ws-f", "ws-f"]  # the two calls; the compile asked for no turn


def test_code_the_compiler_warns_about_is_compiled_per_call(sandbox: Sandbox) -> None:
    """A call that compiles shows the compiler's warnings on its stderr; loaded code would
    not, so such code is never kept."""
    code = "def handle(input, ctx):\n    x = 1\n    return x is 1\n"
    outs = [run(sandbox, code, {}, ws="ws-w") for _ in range(4)]
    deadline = time.monotonic() + 5
    while Compiled.key("ws-w", code) in sandbox.runtime.compiled._pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    outs.append(run(sandbox, code, {}, ws="ws-w"))
    for out in outs:
        assert out.kind == "return" and out.value is True, out
        assert "SyntaxWarning" in out.stderr, out.stderr
    assert sandbox.runtime.compiled.get(Compiled.key("ws-w", code)) is None


def test_the_compile_child_is_sent_the_source_alone(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the compile child gets: the source, no input, no context, a link with nothing
    to give (no ctx tool, no audit)."""
    seen: list[tuple[RunRequest, object, object]] = []
    acquired = sandbox.run_acquired

    def recording(req: RunRequest, link: Any, extra: Any, *rest: Any) -> RunOutcome:
        seen.append((req, link, extra))
        return acquired(req, link, extra, *rest)

    monkeypatch.setattr(sandbox, "run_acquired", recording)
    code = "def handle(input, ctx):\n    return sorted(input)\n"
    for i in range(2):
        req = RunRequest(
            "python", code, "handle", {"secret": SECRET}, 5000, {"toolCallId": f"c{i}"}, "ws-c"
        )
        assert sandbox.run(req, NoCtx()).value == ["secret"]
    assert compiled_for(sandbox, "ws-c", code) is not None
    compiles = [(req, link) for req, link, extra in seen if extra and extra.get("compile_only")]
    assert len(compiles) == 1 and len(seen) == 3, seen
    req, link = compiles[0]
    assert req.code == code and req.input == {} and req.context == {}
    assert type(link).__name__ == "_SourceOnly" and link.call("x", {}) == {"error": "unknown_tool"}


def test_one_workspace_cannot_fill_the_compile_queue() -> None:
    cache = Compiled()
    keys = [Compiled.key("ws-busy", f"code {i}") for i in range(8)]
    for key in keys:
        cache.wanted(key)  # seen once
    asked = [key for key in keys if cache.wanted(key)]
    assert len(asked) == compiled_module.MAX_PENDING_PER_WORKSPACE
    other = Compiled.key("ws-other", "code")
    assert not cache.wanted(other) and cache.wanted(other)  # another workspace still gets in
    cache.done(asked[0], "text")
    assert cache.wanted(keys[-1])  # a turn freed: the next of that workspace is asked for
