"""The code checker pool on its own: limits, replacement, ownership, and answers it does not
trust. Real checker processes (``python -I -m toolkiln.sandbox.checker``) unless a test
gives a program of its own that answers as a checker taken over by hostile text would."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.errors import TooManyRequests
from toolkiln.sandbox.checks import CheckerPool

ORDINARY = "import pytz\ndef main(**p):\n    return {'message': 'ok'}\n"
FSTRING = "def main(**p):\n    return {'message': f'" + "{1=}" * 65_000 + "'}\n"
# Ordinary code, ~80 MB to parse: over a checker's memory when that is 48 MB.
LARGE = (
    "def main(**p):\n"
    + "".join(f"    x{i} = [i * 2 for i in range({i})] + [{i}, {i + 1}]\n" for i in range(4000))
    + "    return {'message': 'x'}\n"
)


@pytest.fixture(scope="module")
def pool() -> Iterator[CheckerPool]:
    checks = CheckerPool()
    yield checks
    checks.close()


def test_an_analysis_has_everything_a_caller_needs(pool: CheckerPool) -> None:
    found = pool.analyse("python", ORDINARY, "ws-a")
    assert found == Analysis(entrypoint="main", imports=("pytz",), takes_ctx=False)
    js = pool.analyse(
        "javascript", "import _ from 'lodash'\nexport function main() { return 1 }", "ws-a"
    )
    assert js.entrypoint == "main" and js.imports == ("lodash",)
    assert js.script.splitlines() == [
        "const _ = __tk_default(require('lodash'));",
        "       function main() { return 1 }",
    ]
    bad = pool.analyse("python", "def main(:\n", "ws-a")
    assert bad.problems[0]["field"] == "code" and bad.problems[0]["line"] == 1 and not bad.limit


def test_text_refused_before_parsing_never_reaches_a_checker(pool: CheckerPool) -> None:
    started = pool.started
    assert pool.analyse("ruby", "x", "ws-a").problems[0]["field"] == "language"
    assert "NUL" in pool.analyse("python", "a\x00", "ws-a").problems[0]["message"]
    assert "at most" in pool.analyse("python", "x" * 300_000, "ws-a").problems[0]["message"]
    assert pool.started == started


def test_past_its_time_a_checker_is_killed_and_replaced() -> None:
    checks = CheckerPool(seconds=0.5)
    try:
        slow = checks.analyse("python", FSTRING, "ws-a")
        assert slow.limit == "time" and "took longer than 0.5 s" in slow.problems[0]["message"]
        assert checks.idle() == {}  # killed, never kept
        assert checks.analyse("python", ORDINARY, "ws-a").entrypoint == "main"  # a new one
        assert checks.started >= 2 and checks.over_limit == 1
    finally:
        checks.close()


def test_past_its_memory_a_checker_ends_and_the_text_is_refused() -> None:
    checks = CheckerPool(memory_mb=48)
    try:
        found = checks.analyse("python", LARGE, "ws-a")
        assert found.limit == "memory", found
        assert "more than 48 MB of memory" in found.problems[0]["message"]
        assert checks.analyse("python", ORDINARY, "ws-a").entrypoint == "main"
    finally:
        checks.close()


def test_a_checker_serves_one_workspace_only(pool: CheckerPool) -> None:
    """Its answers go to the workspace that first used it: a checker taken over by one
    workspace's text can never answer another's."""
    pool.analyse("python", ORDINARY, "ws-owner-a")
    pool.analyse("python", ORDINARY, "ws-owner-b")
    owners = {owner: pid for pid, owner in pool.idle().items()}
    assert owners["ws-owner-a"] != owners["ws-owner-b"]
    pool.analyse("python", ORDINARY, "ws-owner-a")
    assert {owner: pid for pid, owner in pool.idle().items()}["ws-owner-a"] == owners["ws-owner-a"]


def test_a_workspace_holds_all_checkers_but_one_and_queues_few() -> None:
    """Four slow texts of one workspace: two run on two of three checkers, two wait, and a
    fifth is refused at once; another workspace's text is checked at once. Each slow text
    parses in 3.8 s on a quiet machine: a 2 s limit ends every one of them."""
    checks = CheckerPool(workers=3, seconds=2.0)
    done: list[str] = []
    try:
        slow = [
            threading.Thread(
                target=lambda: done.append(checks.analyse("python", FSTRING, "a").limit)
            )
            for _ in range(4)
        ]
        for t in slow:
            t.start()
        deadline = time.monotonic() + 30
        while not (checks.fair.held.get("a") == 2 and checks.fair.waiting() == 2):
            assert time.monotonic() < deadline, "the slow texts never filled a's share"
            time.sleep(0.01)
        with pytest.raises(TooManyRequests):
            checks.analyse("python", ORDINARY, "a")
        assert checks.analyse("python", ORDINARY, "b").entrypoint == "main"
        assert len(done) == 0
        for t in slow:
            t.join(60)
        assert done == ["time"] * 4
    finally:
        checks.close()


# A checker that answers out of the rules: each request gets the next answer of ANSWERS.
LIAR = """
import json, socket, struct, sys
sock = socket.socket(fileno=0)
def send(raw):
    sock.sendall(struct.pack('>I', len(raw)) + raw)
send(b'{"op": "ready"}')
answer = sys.argv[1].encode()
while True:
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        break
    sock.recv(struct.unpack('>I', head)[0], socket.MSG_WAITALL)
    if answer == b'HUGE':
        sock.sendall(struct.pack('>I', 1 << 30))
    else:
        send(answer)
"""
OK = {"problems": [], "entrypoint": "main", "imports": [], "script": ""}
LIES = {
    "not json": "nope",
    "not an analysis": '{"op": "ready"}',
    "extra key": {**OK, "also": 1},
    "a script for python": {**OK, "script": "evil()"},
    "entrypoint and problems": {**OK, "problems": [{"field": "code", "message": "x"}]},
    "another entrypoint": {**OK, "entrypoint": "evil"},
    "a problem of another field": {
        **OK,
        "entrypoint": "",
        "problems": [{"field": "name", "message": "x"}],
    },
    "a line outside the code": {
        **OK,
        "entrypoint": "",
        "problems": [{"field": "code", "message": "x", "line": 10**9}],
    },
    "a lone surrogate": {**OK, "imports": ["\\ud800"]},
    "more names than the code": {**OK, "imports": [f"m{i}" for i in range(100)]},
    "a huge frame": "HUGE",
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_an_answer_out_of_the_rules_is_never_used(lie: str) -> None:
    raw = LIES[lie]
    text = raw if isinstance(raw, str) else json.dumps(raw)
    if lie == "a lone surrogate":
        text = text.replace("\\\\ud800", "\\ud800")
    checks = CheckerPool(argv=[sys.executable, "-I", "-S", "-c", LIAR, text])
    try:
        found = checks.analyse("python", ORDINARY, "ws-a")
        assert found.limit == "failed" and found.problems[0]["field"] == "code", found
        assert "checker failed" in found.problems[0]["message"]
        assert checks.idle() == {}  # never asked again
    finally:
        checks.close()


# A checker's confinement on its own: what a parser bug turned into code could try.
CONFINED = """
import os, signal, socket, sys
from toolkiln.sandbox import checker
checker._confine(64, 10, int(sys.argv[1]), True)
def attempt(name, act):
    try:
        act()
        print(name, "done", flush=True)
    except OSError as exc:
        print(name, type(exc).__name__, flush=True)
attempt("open", lambda: open("/etc/hostname").read())
attempt("stop another checker", lambda: os.kill(int(sys.argv[2]), signal.SIGSTOP))
attempt("signal itself", lambda: os.kill(os.getpid(), 0))
socket.socket()
print("unreachable", flush=True)
"""


def test_a_confined_checker_only_computes_and_answers(pool: CheckerPool) -> None:
    import os
    import signal
    import subprocess

    pool.analyse("python", ORDINARY, "ws-target")
    target = next(pid for pid, owner in pool.idle().items() if owner == "ws-target")
    run = subprocess.run(
        [sys.executable, "-I", "-c", CONFINED, str(os.getpid()), str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert run.stdout.splitlines() == [
        "open PermissionError",
        "stop another checker PermissionError",
        "signal itself done",
    ], run.stderr
    assert run.returncode == -signal.SIGSYS  # a socket: killed
    with open(f"/proc/{target}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] != "T"  # not stopped
    assert pool.analyse("python", ORDINARY + "\n", "ws-target").entrypoint == "main"
