"""The Python sandbox on its own: packages, refusing to start without a layer, limits."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.links import NoCtx, analysed
from toolkiln.domain.execution import RunRequest
from toolkiln.sandbox import python_runtime
from toolkiln.sandbox import runner as runner_module
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.jail.protocol import Caps
from toolkiln.sandbox.packages import PYTHON_PACKAGES, PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable
from toolkiln.sandbox.runner import Limits, Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox
from toolkiln.sandbox.uids import UidRange


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=2)
    yield sb
    sb.close()


def run(sb: Sandbox, code: str, timeout_ms: int = 5000):
    return sb.run(analysed("python", code, timeout_ms), NoCtx())


def test_a_listed_package_installs_on_first_import(sandbox: Sandbox) -> None:
    code = (
        "from dateutil.relativedelta import relativedelta\n"
        "import datetime\n"
        "def handle(i, c):\n"
        "    return str(datetime.date(2026, 1, 31) + relativedelta(months=1))"
    )
    out = run(sandbox, code, timeout_ms=10000)
    assert out.kind == "return" and out.value == "2026-02-28", (out.kind, out.message)
    assert (sandbox.packages.root / "dateutil").is_dir()


def test_everything_listed_imports(sandbox: Sandbox) -> None:
    sandbox.packages.install(list(PYTHON_PACKAGES))
    names = sorted(PYTHON_PACKAGES)
    code = (
        f"NAMES = {names!r}\n"
        "import importlib\n"
        "def handle(i, c):\n"
        "    mods = {n: importlib.import_module(n) for n in NAMES}\n"
        "    np = mods['numpy']\n"
        "    return {'sum': int(np.arange(10).sum()), 'yaml': mods['yaml'].safe_dump({'a': 1}),\n"
        "            'jinja': mods['jinja2'].Template('{{ x }}!').render(x='hi'),\n"
        "            'bs4': mods['bs4'].BeautifulSoup('<b>t</b>', 'html.parser').b.text,\n"
        "            'regex': bool(mods['regex'].match(r'\\p{L}+', 'abc'))}"
    )
    out = run(sandbox, code, timeout_ms=20000)
    assert out.kind == "return", (out.kind, out.error_type, out.message)
    assert out.value == {"sum": 45, "yaml": "a: 1\n", "jinja": "hi!", "bs4": "t", "regex": True}


def test_an_unlisted_module_fails_clearly(sandbox: Sandbox) -> None:
    out = run(sandbox, "import requests\ndef handle(i, c):\n    return 1")
    assert out.kind == "exception" and out.error_type == "ModuleNotFoundError"
    assert "requests" in out.message and "numpy" in out.message


def test_a_missing_layer_refuses_to_start_unless_insecure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_cgroups(*args: object, **kwargs: object) -> None:
        raise OSError("no cgroup controllers on this host")

    monkeypatch.setattr(runner_module, "Cgroups", no_cgroups)
    with pytest.raises(SandboxUnavailable, match="cgroup"):
        python_sandbox(PackageStore(tmp_path / "a"), warm=1)
    insecure = python_sandbox(PackageStore(tmp_path / "b"), warm=1, strict=False)
    try:
        described = insecure.describe()
        assert described["insecure"] is True and described["isolation"]["cgroup"] is None
        out = run(insecure, "def handle(i, c):\n    return 2")
        assert out.kind == "return" and out.value == 2
    finally:
        insecure.close()


def test_timeout_kills_even_a_thread_that_outlives_the_entrypoint(sandbox: Sandbox) -> None:
    code = (
        "import threading, time\n"
        "def handle(i, c):\n"
        "    threading.Thread(target=lambda: time.sleep(100)).start()\n"
        "    return 'returned'"
    )
    out = run(sandbox, code)
    assert out.kind == "return" and out.value == "returned"


class Refusing(NoCtx):
    """A link that refuses the run once a process is ready (the tool was disabled)."""

    def __init__(self) -> None:
        self.asked = 0

    def admit(self) -> bool:
        self.asked += 1
        return False


def test_a_run_the_link_does_not_admit_never_starts(sandbox: Sandbox) -> None:
    link = Refusing()
    code = "def handle(i, c):\n    raise SystemExit('must not run')\n"
    out = sandbox.run(RunRequest("python", code, "handle", {}, 5000), link)
    assert out.kind == "not_admitted" and link.asked == 1
    # The pool is not poisoned by it: the next run works.
    assert run(sandbox, "def handle(i, c):\n    return 7\n").value == 7


class Unreachable(NoCtx):
    """A link whose status read fails (the database is down while the call waited)."""

    def admit(self) -> bool:
        raise ConnectionError("the database is unreachable")


def test_a_link_that_fails_to_admit_gives_its_process_back(sandbox: Sandbox) -> None:
    """The taken process is released (and replaced) whatever admit raises: calls during a
    database outage must not drain the pool (warm=2 here: five such calls would)."""
    code = "def handle(i, c):\n    raise SystemExit('must not run')\n"
    for _ in range(5):
        with pytest.raises(ConnectionError):
            sandbox.run(RunRequest("python", code, "handle", {}, 5000), Unreachable())
    for _ in range(3):
        assert run(sandbox, "def handle(i, c):\n    return 7\n", timeout_ms=3000).value == 7
    deadline = time.monotonic() + 10
    while sandbox.template.health()["warm"] < 2:
        assert time.monotonic() < deadline, sandbox.template.health()
        time.sleep(0.05)


def _nice_of(stat: str) -> int:
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of /proc/<pid>/stat


def _warm_children(sb: Sandbox) -> list[int]:
    """Host pids of the processes running as one of this sandbox's uids (its children)."""
    low = sb.uids.first
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if low <= entry.stat().st_uid < low + sb.uids.count:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_children_warm_at_low_priority_and_a_call_runs_at_the_services(
    sandbox: Sandbox,
) -> None:
    # Wait until the sandbox's processes are warm children only (the child of an earlier
    # call may still be on its way out, at the service's priority).
    deadline = time.monotonic() + 30
    nices: set[int] = set()
    while time.monotonic() < deadline:
        nices = set()
        for pid in _warm_children(sandbox):
            with contextlib.suppress(OSError):  # one may have ended meanwhile
                nices.add(_nice_of(Path(f"/proc/{pid}/stat").read_text()))
        if nices == {python_runtime.WARM_NICE}:
            break
        time.sleep(0.05)
    assert nices == {python_runtime.WARM_NICE}
    code = "import os\ndef handle(i, c):\n    return os.getpriority(os.PRIO_PROCESS, 0)\n"
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == os.getpriority(os.PRIO_PROCESS, 0)


def test_takers_waiting_together_each_get_a_child_of_their_own(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A child made wakes one waiting taker (pool.py): with one warm child and six takers
    waiting at once, each gets a distinct live child and none is handed out twice."""
    sb = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=1)
    try:
        taken: list[object] = []
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def taker() -> None:
            start.wait()
            try:
                child = sb.template.take(timeout=60, replenish=True)
                taken.append(child)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=taker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not errors, errors
        assert len(taken) == 6
        assert len({c.global_pid for c in taken}) == 6  # type: ignore[attr-defined]
        assert all(c.alive() for c in taken)  # type: ignore[attr-defined]
        for c in taken:
            c.close()  # type: ignore[attr-defined]
        # A taker that gives up empty-handed does not keep the wake-up of a child made later.
        with pytest.raises(SandboxUnavailable):
            while True:  # empty the pool (nothing asked for in its place), then give up
                sb.template.take(timeout=0.01, replenish=False).close()
        # The children taken and closed above are replaced as their ends are reported.
        assert run(sb, "def handle(i, c):\n    return 7\n", timeout_ms=10000).value == 7
    finally:
        sb.close()


def test_the_host_refuses_frames_that_are_not_json() -> None:
    """NaN and Infinity are what Python's json accepts and no database stores."""
    from toolkiln.sandbox.jail import protocol

    for body in (b'{"value": NaN}', b'{"value": Infinity}', b"[-Infinity]"):
        with pytest.raises(protocol.FrameError):
            protocol.decode(body)
    assert protocol.decode(b'{"value": 1.5}')[0] == {"value": 1.5}


def test_each_call_draws_its_own_random_numbers(sandbox: Sandbox) -> None:
    """Children are forked without CPython's after-fork hooks (jail/linux.py fork): random's
    reseed is done by hand, or every call would start from the template's state."""
    code = "import random\ndef handle(i, c):\n    return [random.random() for _ in range(3)]"
    drawn = [run(sandbox, code) for _ in range(4)]
    assert all(out.kind == "return" for out in drawn), [out.message for out in drawn]
    assert len({tuple(out.value) for out in drawn}) == 4


def test_a_tool_can_use_threads_after_the_fork(sandbox: Sandbox) -> None:
    code = (
        "import threading\n"
        "def handle(i, c):\n"
        "    seen = []\n"
        "    lock = threading.Lock()\n"
        "    def work(n):\n"
        "        with lock:\n"
        "            seen.append(n)\n"
        "    ts = [threading.Thread(target=work, args=(n,)) for n in range(4)]\n"
        "    for t in ts:\n"
        "        t.start()\n"
        "    for t in ts:\n"
        "        t.join()\n"
        "    main = threading.main_thread() is threading.current_thread()\n"
        "    return {'seen': sorted(seen), 'main': main, 'active': threading.active_count()}"
    )
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == {"seen": [0, 1, 2, 3], "main": True, "active": 1}


def test_asyncio_is_preloaded_without_ssl_and_a_tool_can_still_import_ssl(
    sandbox: Sandbox,
) -> None:
    """The template imports asyncio without ssl (pyrunner.without_ssl): a child starts with
    asyncio and without ssl, asyncio works, and a tool that imports ssl gets the real one."""
    code = (
        "import sys\n"
        "import asyncio\n"
        "def handle(i, c):\n"
        "    before = {'ssl': 'ssl' in sys.modules, 'asyncio': 'asyncio.base_events' in sys.modules}\n"
        "    async def later():\n"
        "        await asyncio.sleep(0.001)\n"
        "        return 7\n"
        "    import ssl\n"
        "    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n"
        "    return {**before, 'ran': asyncio.run(later()), 'tls': ctx.protocol.name}"
    )
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == {"ssl": False, "asyncio": True, "ran": 7, "tls": "PROTOCOL_TLS_CLIENT"}


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11), reason="RESUME_QUICK is how CPython 3.11 shows quickening"
)
@pytest.mark.parametrize("says_async", [False, True], ids=["lean-template", "asyncio-template"])
def test_the_runners_code_on_a_calls_path_is_quickened_before_the_call(
    sandbox: Sandbox, says_async: bool
) -> None:
    """Each template rehearses a child's path before it forks (pyrunner.rehearse): CPython
    3.11 quickens a code object once it has started 8 times, writing into it, and a child
    runs the runner's functions once or twice (its warm-up and the call), so without the
    rehearsal every child quickened them again, a copy-on-write fault per page written
    (docs/decisions/103-template-rehearses-the-call-path.md); the asyncio template rehearses an
    ``async def`` sample too (``Runner.run``, which a child runs only for an async tool). A tool
    finds them quickened (``RESUME_QUICK``), and at its import no event loop current or running, no
    thread but its own, the loop made for it open (a module's
    ``asyncio.get_event_loop()`` makes a loop of its own, as without the rehearsal)."""
    # The module's name is spelled in two parts: code that says "async" runs in the asyncio
    # template (needs_asyncio is a text match), and the lean one is tested here too.
    code = (
        "import dis, sys\n"
        "AIO = sys.modules.get('asyn' + 'cio')\n"
        "import threading\n"
        "POLICY = AIO and AIO.events._event_loop_policy\n"
        "SET = bool(POLICY) and (POLICY._local._set_called or POLICY._local._loop is not None)\n"
        "RUNNING = AIO is not None and AIO._get_running_loop() is not None\n"
        "THREADS = threading.active_count()\n"
        "MADE = sys.modules['pyrunner']._RUNNER\n"
        "CLOSED = MADE is not None and MADE.get_loop().is_closed()\n"
        "def first(fn):\n"
        "    return next(dis.get_instructions(fn, adaptive=True)).opname\n"
        "def handle(i, c):\n"
        "    print('mine')\n"
        "    runner = sys.modules['pyrunner']\n"
        "    seen = {n: first(getattr(runner, n)) for n in ('_answer', '_execute', '_call')}\n"
        "    if AIO is not None:\n"
        "        seen['Runner.run'] = first(AIO.Runner.run)\n"
        "    return {'first': seen, 'set': SET, 'running': RUNNING, 'threads': THREADS,\n"
        "            'made': MADE is not None, 'closed': CLOSED}\n"
    ) + ("# async\n" if says_async else "")
    out = sandbox.run(RunRequest("python", code, "handle", {"q": 1}, 5000), NoCtx())
    assert out.kind == "return", (out.kind, out.message)
    quick = dict.fromkeys(("_answer", "_execute", "_call"), "RESUME_QUICK")
    if says_async:  # the asyncio path of an async tool, rehearsed with an async sample
        quick["Runner.run"] = "RESUME_QUICK"
    assert out.value == {
        "first": quick,
        "set": False,
        "running": False,
        "threads": 1,
        "made": says_async,  # the asyncio template's child makes its loop while it waits
        "closed": False,
    }
    assert out.stdout == "mine\n"


@pytest.mark.parametrize("says_async", [False, True], ids=["lean-template", "asyncio-template"])
def test_modules_outside_the_preload_are_not_in_a_child_and_still_import(
    sandbox: Sandbox, says_async: bool
) -> None:
    """Only what the preload list names (and what the jail's own code needs) is in the
    template: every module more is page-table work for each fork and exit. tempfile, shutil
    and the compression modules came in by accident once (importlib.abc); they are not there
    when a tool starts, in either template, and a tool that imports them gets them, C
    libraries and all."""
    names = ("tempfile", "shutil", "zlib", "bz2", "lzma", "importlib.abc", "importlib.resources")
    code = (
        "import sys\n"
        f"NAMES = {names!r}\n"
        "BEFORE = [n for n in NAMES if n in sys.modules]\n"
        "def handle(i, c):\n"
        "    import bz2, lzma, os, tempfile, zlib\n"
        "    data = b'toolkiln' * 100\n"
        "    same = all(m.decompress(m.compress(data)) == data for m in (zlib, bz2, lzma))\n"
        "    with tempfile.TemporaryDirectory() as d:\n"
        "        open(os.path.join(d, 'x'), 'w').close()\n"
        "        made = os.listdir(d)\n"
        "    return {'before': BEFORE, 'same': same, 'made': made}\n"
    ) + ("# async\n" if says_async else "")
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == {"before": [], "same": True, "made": ["x"]}


def test_code_that_says_async_runs_where_asyncio_is_preloaded_and_other_code_without_it(
    sandbox: Sandbox,
) -> None:
    """Two templates (runner.needs_asyncio): code that says ``async`` starts with asyncio
    imported; any other code starts without it (cheaper forks,
    docs/decisions/104-what-the-python-template-holds.md) and can still import and run it. Their
    children's uids are disjoint parts of the sandbox's slot, so the two kinds of children never
    share a uid."""
    low, count = int(sandbox.uids.first), int(sandbox.uids.count)
    lean = (
        "import os, sys\n"
        "NAME = 'asyn' + 'cio'\n"
        "BEFORE = NAME + '.base_events' in sys.modules\n"
        "def handle(i, c):\n"
        "    aio = __import__(NAME)\n"
        "    loop = aio.new_event_loop()\n"
        "    try:\n"
        "        ran = loop.run_until_complete(aio.sleep(0.001, result=7))\n"
        "    finally:\n"
        "        loop.close()\n"
        "    return {'before': BEFORE, 'ran': ran, 'uid': os.getuid()}\n"
    )
    said = (
        "import os, sys\n"
        "BEFORE = 'asyncio.base_events' in sys.modules\n"
        "async def handle(i, c):\n"
        "    import asyncio\n"
        "    ran = await asyncio.sleep(0.001, result=7)\n"
        "    return {'before': BEFORE, 'ran': ran, 'uid': os.getuid()}\n"
    )
    seen: dict[bool, set[int]] = {False: set(), True: set()}
    for _ in range(3):
        for says, code in ((False, lean), (True, said)):
            out = run(sandbox, code)
            assert out.kind == "return", (out.kind, out.message)
            assert out.value["before"] is says and out.value["ran"] == 7
            seen[says].add(out.value["uid"])
    split = low + count - python_runtime.ASYNC_UIDS
    assert all(low <= uid < split for uid in seen[False]), (seen, low, split)
    assert all(split <= uid < low + count for uid in seen[True]), (seen, split, count)


ASYNC_CASES = {
    # asyncio.run's context is copied when it runs: what the module set is seen
    "module-context-and-tasks-cancelled-at-the-end": (
        "import asyncio, contextvars\n"
        "VAR = contextvars.ContextVar('v')\n"
        "VAR.set('module')\n"
        "async def left():\n"
        "    try:\n"
        "        await asyncio.sleep(30)\n"
        "    finally:\n"
        "        print('cancelled at the end')\n"
        "async def handle(i, c):\n"
        "    loop = asyncio.get_running_loop()\n"
        "    loop.create_task(left())\n"
        "    await asyncio.sleep(0.001)\n"
        "    return {'var': VAR.get(), 'current': loop is asyncio.get_event_loop()}\n",
        {"var": "module", "current": True},
        "cancelled at the end\n",
    ),
    # the module's own loop is not the one the call runs on (asyncio.run makes a new one)
    "what-the-module-does-to-its-loop-stays-there": (
        "import asyncio\n"
        "async def later():\n"
        "    print('a task of the module ran')\n"
        "MODULES = asyncio.get_event_loop()\n"
        "MODULES.create_task(later())\n"
        "MODULES.stop()\n"
        "async def handle(i, c):\n"
        "    await asyncio.sleep(0.001)\n"
        "    return asyncio.get_running_loop() is MODULES\n",
        False,
        "",
    ),
    "the-module-closed-its-loop": (
        "import asyncio\n"
        "asyncio.get_event_loop().close()\n"
        "async def handle(i, c):\n"
        "    await asyncio.sleep(0.001)\n"
        "    return 5\n",
        5,
        "",
    ),
    "a-plain-entry-runs-its-own-loop": (
        "import asyncio\n"
        "async def seven():\n"
        "    await asyncio.sleep(0.001)\n"
        "    return 7\n"
        "def handle(i, c):\n"
        "    return asyncio.run(seven()) + asyncio.run(seven())\n",
        14,
        "",
    ),
    "an-async-generator-finalized-at-the-end": (
        "import asyncio\n"
        "async def gen():\n"
        "    try:\n"
        "        yield 1\n"
        "        yield 2\n"
        "    finally:\n"
        "        print('generator closed')\n"
        "KEEP = []\n"
        "async def handle(i, c):\n"
        "    g = gen()\n"
        "    KEEP.append(g)\n"
        "    return await g.__anext__()\n",
        1,
        "generator closed\n",
    ),
}


@pytest.mark.parametrize("case", sorted(ASYNC_CASES))
def test_async_code_runs_as_under_asyncio_run(sandbox: Sandbox, case: str) -> None:
    """An async entry runs on a loop its child made before the request (pyrunner
    ._prepare_loop, docs/decisions/104-what-the-python-template-holds.md): what ``asyncio.run`` does
    still holds (a copy of the context at the run, tasks left cancelled and async generators
    finalized before the result, with their output in the logs), and what the tool's module does to
    its event loop (stop it, close it, give it tasks) stays off the call's loop."""
    code, value, stdout = ASYNC_CASES[case]
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == value and out.stdout == stdout, (out.value, out.stdout)


def test_shutil_copies_and_moves_files_in_the_scratch(sandbox: Sandbox) -> None:
    """shutil.copyfile copies with sendfile on Linux: the filter allows it (it was a kill, a
    ``sandbox_violation`` for a tool copying its own file), as it allows copy_file_range."""
    code = (
        "import os, shutil, tempfile\n"
        "def handle(i, c):\n"
        "    d = tempfile.mkdtemp()\n"
        "    with open(os.path.join(d, 'a'), 'w') as f:\n"
        "        f.write('toolkiln' * 10000)\n"
        "    shutil.copy(os.path.join(d, 'a'), os.path.join(d, 'b'))\n"
        "    shutil.copytree(d, d + '-tree')\n"
        "    shutil.move(os.path.join(d, 'b'), os.path.join(d, 'c'))\n"
        "    tree = sorted(os.listdir(d + '-tree'))\n"
        "    same = open(os.path.join(d, 'c')).read() == 'toolkiln' * 10000\n"
        "    shutil.rmtree(d + '-tree')\n"
        "    return {'here': sorted(os.listdir(d)), 'tree': tree, 'same': same,\n"
        "            'gone': not os.path.exists(d + '-tree')}"
    )
    out = run(sandbox, code)
    assert out.kind == "return", (out.kind, out.message)
    assert out.value == {"here": ["a", "c"], "tree": ["a", "b"], "same": True, "gone": True}


def test_a_child_starts_with_its_own_home_and_the_fixed_environment(sandbox: Sandbox) -> None:
    """The fixed part of the environment and the ignored signals are set once in the template
    (child.prepare), HOME and TMPDIR per child: together what each call sees."""
    code = (
        "import os, signal\n"
        "def handle(i, c):\n"
        "    return {'env': dict(os.environ), 'cwd': os.getcwd(),\n"
        "            'signals': [int(signal.getsignal(s)) for s in\n"
        "                        (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)]}"
    )
    first, second = run(sandbox, code), run(sandbox, code)
    for out in (first, second):
        assert out.kind == "return", (out.kind, out.message)
        cwd = out.value["cwd"]
        assert out.value["env"] == {
            "HOME": cwd,
            "TMPDIR": cwd,
            "LANG": "C.UTF-8",
            "PATH": "/nonexistent",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        assert out.value["signals"] == [
            int(signal.SIG_DFL),
            int(signal.SIG_IGN),
            int(signal.SIG_IGN),
        ]
    assert first.value["cwd"] != second.value["cwd"]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def main(**p):\n    return {'message': 'no ctx', 'rawData': p}", ("no ctx", {"a": 1})),
        (
            "def main(*, ctx, **p):\n    return {'message': ctx.toolCallId, 'rawData': p}",
            ("call-1", {"a": 1}),
        ),
        (
            "def main(a, ctx=None):\n    return {'message': str(ctx), 'rawData': {'a': a}}",
            ("None", {"a": 1}),
        ),
        (
            "import functools\n"
            "def keep(fn):\n"
            "    @functools.wraps(fn)\n"
            "    def wrapper(**kw):\n"
            "        return fn(**kw)\n"
            "    return wrapper\n"
            "@keep\n"
            "def main(*, ctx, **p):\n    return {'message': ctx.toolCallId, 'rawData': p}",
            ("call-1", {"a": 1}),
        ),
    ],
    ids=["no-ctx", "keyword-only-ctx", "positional-ctx", "wrapped"],
)
def test_main_gets_ctx_only_when_it_declares_it_keyword_only(
    sandbox: Sandbox, code: str, expected: tuple[str, object]
) -> None:
    request = RunRequest("python", code, "main", {"a": 1}, 5000, {"toolCallId": "call-1"})
    out = sandbox.run(request, NoCtx())
    assert out.kind == "return", (out.kind, out.message)
    assert (out.value["message"], out.value["rawData"]) == expected


def test_collapsing_the_template_heap_keeps_its_content() -> None:
    """jail/linux.collapse (MADV_COLLAPSE on the template's heap) changes how memory is
    backed, never what it holds."""
    import ctypes
    import mmap

    from toolkiln.sandbox.jail import linux

    size = 3 * linux.HUGE_PAGE
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pattern = bytes(range(256)) * (size // 256)
    area[:] = pattern
    view = ctypes.c_char.from_buffer(area)
    address = ctypes.addressof(view)
    del view
    ranges = linux.anonymous_ranges()
    assert any(low <= address and address + size <= high for low, high in ranges)
    collapsed = linux.collapse(ranges)
    if collapsed == 0:
        area.close()
        pytest.skip("this kernel collapsed nothing (MADV_COLLAPSE needs Linux 6.1 and THP)")
    assert area[:] == pattern
    area.close()


CRASHED = """
import os, sys
from pathlib import Path
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.sandboxes import python_sandbox
from toolkiln.sandbox.uids import UidRange
parent = os.environ.get("TOOLKILN_SANDBOX_CGROUP", "")  # a rootless shape's (conftest.py)
sb = python_sandbox(
    PackageStore(Path(sys.argv[1])), warm=1, name="leftover-test", cgroup_parent=parent
)
print(sb.uids.slot, *sb.cgroups.roots, flush=True)
os.kill(os.getpid(), 9)  # dies holding its cgroups, as a crashed service does
"""


def test_cgroups_a_crashed_sandbox_left_are_reused_and_removed_by_its_slots_next(
    tmp_path: Path,
) -> None:
    """A sandbox's cgroups are named by its uid slot: those of a process killed before it
    could close them are taken over by the next sandbox of that slot and name, and removed
    when it closes (named by object id, every crash left a tree for good)."""
    out = subprocess.run(
        [sys.executable, "-c", CRASHED, str(tmp_path)], capture_output=True, text=True
    )
    slot_text, *root_texts = out.stdout.split()
    roots = [Path(r) for r in root_texts]
    assert roots and all(r.is_dir() for r in roots), out.stderr
    held = []  # hold every lower free slot, so the next sandbox gets the dead one's
    try:
        while True:
            claim = UidRange()
            if claim.slot == int(slot_text):
                claim.release()
                break
            held.append(claim)
        deadline = time.monotonic() + 10
        while True:  # its template and children may take a moment to be gone
            try:
                sb = python_sandbox(PackageStore(tmp_path), warm=1, name="leftover-test")
                break
            except SandboxUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        for claim in held:
            claim.release()
    try:
        assert sb.cgroups is not None and sb.cgroups.roots == roots
        assert run(sb, "def handle(i, c):\n    return 7\n").value == 7
    finally:
        sb.close()
    assert not any(r.exists() for r in roots)


class _FewUids(python_runtime.PythonRuntime):
    """Python whose (lean) template may have only warm + 1 children alive at once."""

    def configs(self, base: JailConfig) -> list[JailConfig]:
        lean, with_asyncio = super().configs(base)
        return [lean.replace(uid_count=base.warm + 1), with_asyncio]


def test_a_template_at_its_uid_capacity_makes_the_children_it_owes(
    tmp_path: Path,
) -> None:
    """Children owed (every replacement: the template makes one for each child it reaps;
    and any asked for while every uid is in use) are made as soon as a uid is free, so the
    pool keeps serving at its uid capacity. (The template's reap used to return before the
    code that made them: with replacements made on reap, no call found a second child.)"""
    sb = Sandbox(_FewUids(), PackageStore(tmp_path), warm=2)
    try:
        for _ in range(12):
            out = run(sb, "def handle(i, c):\n    return 7\n", timeout_ms=5000)
            assert (out.kind, out.value) == ("return", 7), out.message
        deadline = time.monotonic() + 10
        while sb.template.health()["warm"] < 2:
            assert time.monotonic() < deadline, sb.template.health()
            time.sleep(0.05)
    finally:
        sb.close()


def test_calls_beyond_the_warm_children_run_at_once_and_the_pool_shrinks_back(
    tmp_path: Path,
) -> None:
    """Six slow calls with two warm children: each waiting call has a child made for it, so
    all six run at once (the fair share's places, not the warm count, bound them); once they
    end, the pool holds its two warm children again, not six."""
    sb = python_sandbox(PackageStore(tmp_path), warm=2)
    code = (
        "import time\n"
        "def handle(i, c):\n"
        "    start = time.time()\n"
        "    time.sleep(2)\n"
        "    return [start, time.time()]\n"
    )
    try:
        outs: list[object] = []
        threads = [
            threading.Thread(target=lambda: outs.append(run(sb, code, 20000))) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        spans = [o.value for o in outs if o.kind == "return"]  # type: ignore[attr-defined]
        assert len(spans) == 6, outs
        assert max(s[0] for s in spans) < min(s[1] for s in spans), "a call waited for another"
        deadline = time.monotonic() + 10
        while sb.template.health()["warm"] != 2:
            assert time.monotonic() < deadline, sb.template.health()
            time.sleep(0.05)
        time.sleep(0.5)  # no late child beyond the two
        assert sb.template.health()["warm"] == 2
    finally:
        sb.close()


def test_children_the_host_throws_away_are_not_replaced_without_end(tmp_path: Path) -> None:
    """Only a child that served a call is replaced when its end is reported: one the host
    throws away (here: its cgroup cannot be joined, in strict mode) is not, so a fault in
    every new child cannot turn into a loop of forks (review: 1831 in 2 s when the template
    replaced every child it reaped)."""
    sb = python_sandbox(PackageStore(tmp_path), warm=2)
    try:
        assert sb.cgroups is not None
        assert run(sb, "def handle(i, c):\n    return 7\n").value == 7
        deadline = time.monotonic() + 10
        while sb.template.health()["warm"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        adopted = 0
        adopt = sb.template._adopt

        def counting(*args: object) -> None:
            nonlocal adopted
            adopted += 1
            adopt(*args)  # type: ignore[arg-type]

        def refuse(pid: int) -> None:
            raise OSError("cgroup refused (test)")

        sb.template._adopt = counting  # type: ignore[method-assign]
        sb.cgroups.attach = refuse  # type: ignore[method-assign,assignment]
        assert run(sb, "def handle(i, c):\n    return 8\n").value == 8  # a warm child serves
        time.sleep(1.0)
        assert adopted <= 2, adopted  # its replacement, thrown away, and nothing after it
    finally:
        sb.close()


def test_closing_while_children_are_made_puts_none_in_a_removed_cgroup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox closed while its template is still making children: the pool's reader must
    not put one in a cgroup the close is removing. It did at ~6 closes in 10 (ESRCH or
    ENOENT logged as "could not put sandbox child in its cgroup", for a child of a template
    already stopped); the close now waits for the adoption in progress and the reader's last
    reports, and nothing of the sandbox's cgroups stays."""
    caplog.set_level(logging.ERROR, logger="toolkiln.sandbox")
    for _ in range(8):
        sb = python_sandbox(PackageStore(tmp_path), warm=16, name="close-race-test")
        time.sleep(0.005)  # the first of the sixteen children are being made and adopted
        roots = list(sb.cgroups.roots) if sb.cgroups is not None else []
        sb.close()
        assert roots and not any(r.exists() for r in roots)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


REHEARSAL_PROBE = """
import asyncio, json, os, sys
import pyrunner
from config import JailConfig
cfg = JailConfig("python", (), "", ())
def state():
    return {"fds": sorted(os.listdir("/proc/self/fd")), "stdout": sys.stdout is sys.__stdout__,
            "meta_path": len(sys.meta_path), "policy": asyncio.events._event_loop_policy,
            "runner": pyrunner._RUNNER, "running": asyncio._get_running_loop()}
before = state()
pyrunner.rehearse(cfg, times=12)
after = state()
pyrunner._ASYNC_SAMPLE = {**pyrunner._ASYNC_SAMPLE,
                          "code": "async def main(**p):\\n    raise ValueError('no')\\n"}
try:
    pyrunner.rehearse(cfg, times=1)
    failed = None
except RuntimeError as exc:
    failed = str(exc)
print(json.dumps({"same": before == after, "failed": failed, "after_failure": state() == before,
                  "before": repr(before)}))
"""


def test_the_rehearsal_leaves_the_template_as_it_was_and_a_failed_one_says_why(
    tmp_path: Path,
) -> None:
    """``pyrunner.rehearse`` (run by each Python template before it forks,
    docs/decisions/103-template-rehearses-the-call-path.md) leaves
    no descriptor, no redirected output, no finder, no event loop policy, runner or running
    loop behind, also when a sample fails; a sample that does not return makes it raise,
    naming the report (the template then starts without it, logging a note: template.py)."""
    jail = Path(runner_module.__file__).parent / "jail"
    env = {"PYTHONPATH": str(jail), "PATH": os.environ.get("PATH", "")}
    done = subprocess.run(
        [sys.executable, "-S", "-c", REHEARSAL_PROBE],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["same"] is True, out["before"]
    assert out["after_failure"] is True, out["before"]
    assert out["failed"] is not None and "ValueError" in out["failed"], out["failed"]


def test_a_template_whose_rehearsal_fails_starts_without_it_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The rehearsal is a speed-up only (docs/decisions/103-template-rehearses-the-call-path.md):
    when it fails (here: results capped at 64 bytes, so the sample's own result is too large), the
    template starts anyway and the host logs the template's note; calls run in both templates (and
    meet the same cap)."""
    limits = Limits(caps=Caps(result_bytes=64))
    with caplog.at_level(logging.WARNING, logger="toolkiln.sandbox"):
        sb = python_sandbox(PackageStore(tmp_path / "pkgs"), limits=limits, warm=1)
    try:
        notes = [r.getMessage() for r in caplog.records if "rehearsal failed" in r.getMessage()]
        assert len(notes) == 2, caplog.text  # each of the two Python templates
        for code in (
            "def handle(i, c):\n    return 1\n",
            "async def handle(i, c):\n    return 1\n",
        ):
            out = run(sb, code)  # a frame of ~90 bytes: over the cap, as the sample's was
            assert out.kind == "too_large", (out.kind, out.message)
    finally:
        sb.close()
