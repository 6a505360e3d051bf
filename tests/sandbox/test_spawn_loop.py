"""The template's C loop (jail/_spawn.c) on its own, driven over its control socket as the
host drives it: a uid whose scratch could not be emptied serves no call until it is empty,
and a signal with a Python handler runs in the template instead of being left pending for
the children forked after it. The harness below stands in for template.py (no jail: no
namespaces, no uid change, no filter), so these run as any user."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

JAIL = Path(__file__).parents[2] / "src" / "toolkiln" / "sandbox" / "jail"

HARNESS = textwrap.dedent(
    """
    import os, shutil, signal, sys
    sys.path.insert(0, sys.argv[1])
    import _spawn, protocol

    events = sys.argv[3]
    def log(line):
        with open(events, "a") as f:
            f.write(line + "\\n")

    tries = {}
    prepared = []
    def prepare(uid, scratch):
        prepared.append(uid)
        if len(prepared) == 1 and sys.argv[5] == "blocked":  # a name in the way, once
            log(f"blocked {uid}")
            raise FileExistsError(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        os.mkdir(scratch)

    def empty(uid, scratch):
        tries[uid] = tries.get(uid, 0) + 1
        if tries[uid] == 1 and sys.argv[5] == "dirty":  # the first time, it "cannot" go
            log(f"dirty {uid}")
            return True
        shutil.rmtree(scratch, ignore_errors=True)
        log(f"clean {uid}")
        return False

    class Stop(Exception):
        pass

    def on_usr1(*_):
        log("handler ran in the template")
        raise Stop

    signal.signal(signal.SIGUSR1, on_usr1)
    try:
        made = _spawn.serve(
            ctl=int(sys.argv[2]), uid_base=int(sys.argv[4]), uid_count=1, warm=1,
            javascript=False, own_tmp=False, warm_nice=0, limits=[], drop=False,
            seccomp=None, spawn=protocol.SPAWN, stop=protocol.STOP, prepare=prepare, empty=empty,
        )
    except Stop:
        log("template stopped by its handler")
        sys.exit(0)
    if made is None:
        sys.exit(0)
    uid, scratch, fd = made
    log(f"child {uid} {os.getpid()}")
    with open(os.path.join(scratch, "left-behind"), "w") as f:
        f.write("x")
    os._exit(0)
    """
)


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], socket.socket, Path, int]:
    host, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    events = tmp_path / "events"
    events.touch()
    uid = 1_990_000_000 + os.getpid() % 1_000_000  # a /tmp/<uid> no one else uses
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            str(script),
            str(JAIL),
            str(theirs.fileno()),
            str(events),
            str(uid),
            mode,
        ],
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    host.settimeout(30)
    return proc, host, events, uid


def _next(host: socket.socket, op: str) -> dict:
    while True:
        raw, fds, _, _ = socket.recv_fds(host, 4096, 2)
        for fd in fds:
            os.close(fd)
        assert raw, "the template closed its control socket"
        msg = json.loads(raw)
        if msg["op"] == op:
            return msg


def test_a_uid_whose_scratch_stays_dirty_serves_no_call_until_emptied(tmp_path: Path) -> None:
    proc, host, events, uid = _start(tmp_path, "dirty")
    try:
        first = _next(host, "ready")
        assert first["uid"] == uid
        _next(host, "exit")  # the child left a file; the first emptying "fails"
        host.send(b'{"op": "spawn", "n": 1}')
        second = _next(host, "ready")  # only once the retry emptied it
        assert second["uid"] == uid
        # By the time the second child is reported ready, its uid's scratch was emptied
        # (the template logs "clean" before it frees the uid), and no child of that uid
        # ran while it was dirty.
        lines = events.read_text().splitlines()
        assert lines[:2] == [f"child {uid} {first['pid']}", f"dirty {uid}"], lines
        clean = lines.index(f"clean {uid}")
        assert not [x for x in lines[2:clean] if x.startswith("child")], lines
        assert second["pid"] != first["pid"]
    finally:
        host.close()
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", f"/tmp/{uid}"], check=False)


def test_a_python_signal_handler_runs_in_the_template_not_in_its_children(
    tmp_path: Path,
) -> None:
    proc, host, events, uid = _start(tmp_path, "clean")
    try:
        _next(host, "ready")
        _next(host, "exit")  # its child is reaped: the template waits with no Python to run
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=30) == 0
        lines = events.read_text().splitlines()
        assert "handler ran in the template" in lines
        assert "template stopped by its handler" in lines
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", f"/tmp/{uid}"], check=False)


def test_a_scratch_that_cannot_be_made_holds_its_uid_not_the_template(tmp_path: Path) -> None:
    """Insecure mode: something in the way of a uid's scratch in the host's /tmp (what a
    walk left, a name another uid's tool made) made the template raise and end, with every
    call in flight (found by review). Now that uid waits, dirty, until it is emptied, and
    the child asked for is made then."""
    proc, host, events, uid = _start(tmp_path, "blocked")
    try:
        made = _next(host, "ready")
        assert made["uid"] == uid
        lines = events.read_text().splitlines()
        assert lines[0] == f"blocked {uid}", lines
        assert f"clean {uid}" in lines, lines  # emptied before the child was made
        assert proc.poll() is None
    finally:
        host.close()
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", f"/tmp/{uid}"], check=False)
