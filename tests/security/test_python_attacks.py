"""Malicious Python tools. Each must end in a contained, correctly classified Result, with the
service healthy and nothing left running. Written as an attacker who has read our source."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.security.conftest import SECRET, Target

VIOLATION = {"sandbox_violation"}
RUNTIME = {"runtime_error"}


def ok_and(check: Callable[[Any], bool]) -> Callable[[dict], bool]:
    def inner(res: dict) -> bool:
        return res["status"] == "ok" and check(res["raw_data"])

    return inner


def no_secret(res: dict) -> bool:
    return SECRET not in json.dumps(res)


ATTACKS: list[tuple[str, str, set[str] | Callable[[dict], bool]]] = [
    # --- the host's files, database, secrets
    ("read-etc-shadow", "def handle(i, c):\n    return open('/etc/shadow').read()", RUNTIME),
    ("read-etc-passwd", "def handle(i, c):\n    return open('/etc/passwd').read()", RUNTIME),
    (
        "read-work-tree",
        "def handle(i, c):\n    return open('/work/main/pyproject.toml').read()",
        RUNTIME,
    ),
    (
        "list-root",
        "import os\ndef handle(i, c):\n    return sorted(os.listdir('/'))",
        ok_and(
            lambda d: set(d) <= {"dev", "etc", "lib", "lib64", "pkgs", "proc", "root", "tmp", "usr"}
        ),
    ),
    (
        "environment-secrets",
        "import os\ndef handle(i, c):\n    return dict(os.environ)",
        ok_and(lambda d: not any(k.startswith("TOOLKILN") for k in d)),
    ),
    (
        "proc-environ-of-everyone",
        "import os\ndef handle(i, c):\n    out = []\n    for p in os.listdir('/proc'):\n        if p.isdigit():\n            try:\n                out.append(open(f'/proc/{p}/environ','rb').read().decode())\n            except OSError:\n                pass\n    return out",
        lambda r: no_secret(r),  # there is no /proc in the jail at all
    ),
    (
        "pid-namespace-sees-no-host",
        "import os\ndef handle(i, c):\n    return [p for p in os.listdir('/proc') if p.isdigit()]",
        RUNTIME,  # no /proc: FileNotFoundError
    ),
    (
        "proc-1-root-escape",
        "def handle(i, c):\n    return open('/proc/1/root/etc/hostname').read()",
        RUNTIME,
    ),
    (
        "find-the-database",
        "import os\ndef handle(i, c):\n    hits = []\n    for root, dirs, files in os.walk('/'):\n        if root == '/':\n            dirs[:] = [d for d in dirs if d not in ('proc', 'usr', 'root', 'lib', 'lib64')]\n        hits += [f for f in files if f.endswith('.db') or 'toolkiln' in f]\n    return hits",
        ok_and(lambda d: d == []),
    ),
    (
        "gc-scan-for-secrets",
        "import gc\ndef handle(i, c):\n    return [o for o in gc.get_objects() if isinstance(o, str) and ('tk_' in o or 'postgres' in o)][:50]",
        lambda r: no_secret(r),
    ),
    (
        "frames-walk-for-secrets",
        "import sys\ndef handle(i, c):\n    f, seen = sys._getframe(), []\n    while f:\n        seen += [repr(v)[:200] for v in f.f_globals.values()]\n        f = f.f_back\n    return seen",
        lambda r: no_secret(r),
    ),
    (
        "write-read-only-root",
        "def handle(i, c):\n    open('/usr/lib/evil', 'w').write('x')\n    return 1",
        RUNTIME,
    ),
    # --- the network
    (
        "socket-inet",
        "import socket\ndef handle(i, c):\n    socket.socket(socket.AF_INET).connect(('127.0.0.1', 5432))\n    return 1",
        VIOLATION,
    ),
    (
        "socket-inet6",
        "import socket\ndef handle(i, c):\n    socket.socket(socket.AF_INET6)\n    return 1",
        VIOLATION,
    ),
    (
        "socket-unix",
        "import socket\ndef handle(i, c):\n    socket.socket(socket.AF_UNIX).connect('/run/postgresql/.s.PGSQL.5432')\n    return 1",
        VIOLATION,
    ),
    (
        "socket-netlink",
        "import socket\ndef handle(i, c):\n    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n    return 1",
        VIOLATION,
    ),
    (
        "socket-packet",
        "import socket\ndef handle(i, c):\n    socket.socket(17, socket.SOCK_RAW, 0)\n    return 1",
        VIOLATION,
    ),
    (
        "socketpair-inet",
        "import socket\ndef handle(i, c):\n    socket.socketpair(socket.AF_INET)\n    return 1",
        VIOLATION,
    ),
    (
        "urllib-fetch",
        "import urllib.request\ndef handle(i, c):\n    return urllib.request.urlopen('http://127.0.0.1:8080/healthz').read().decode()",
        VIOLATION,
    ),
    # --- processes, privileges, kernel surface
    ("fork", "import os\ndef handle(i, c):\n    os.fork()\n    return 1", VIOLATION),
    (
        "double-fork-survivor",
        "import os\ndef handle(i, c):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n            import time\n            time.sleep(600)\n    return 1",
        VIOLATION,
    ),
    (
        "subprocess",
        "import subprocess\ndef handle(i, c):\n    return subprocess.run(['id'], capture_output=True).stdout.decode()",
        VIOLATION,
    ),
    (
        "os-system-via-subclasses",
        "def handle(i, c):\n    for k in ().__class__.__base__.__subclasses__():\n        if k.__name__ == '_wrap_close':\n            return k.__init__.__globals__['system']('id')\n    return 0",
        VIOLATION,
    ),
    (
        "posixsubprocess",
        "import _posixsubprocess, os\ndef handle(i, c):\n    r, w = os.pipe()\n    _posixsubprocess.fork_exec(['/bin/sh'], [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, False, None, None, None, -1, None, False)\n    return 1",
        VIOLATION,
    ),
    (
        "execve",
        "import os\ndef handle(i, c):\n    os.execv('/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2', ['x'])\n    return 1",
        VIOLATION,
    ),
    (
        "ptrace-ctypes",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).ptrace(0, 0, 0, 0)\n    return 1",
        VIOLATION,
    ),
    (
        "mount-ctypes",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None)\n    return 1",
        VIOLATION,
    ),
    (
        "unshare-ctypes",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).unshare(0x10000000)\n    return 1",
        VIOLATION,
    ),
    (
        "io-uring-setup",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).syscall(425, 8, None)\n    return 1",
        VIOLATION,
    ),
    (
        "bpf",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).syscall(321, 0, None, 0)\n    return 1",
        VIOLATION,
    ),
    (
        "x32-abi-getpid",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).syscall(0x40000000 | 39)\n    return 1",
        VIOLATION,
    ),
    (
        "keyctl",
        "import ctypes\ndef handle(i, c):\n    ctypes.CDLL(None).syscall(250, 0, 0)\n    return 1",
        VIOLATION,
    ),
    ("chroot", "import os\ndef handle(i, c):\n    os.chroot('/tmp')\n    return 1", VIOLATION),
    (
        "setuid-root",
        "import os\ndef handle(i, c):\n    os.setuid(0)\n    return os.getuid()",
        VIOLATION,
    ),
    (
        "kill-template",
        "import os, signal\ndef handle(i, c):\n    os.kill(1, signal.SIGKILL)\n    return 1",
        RUNTIME,
    ),
    (
        "kill-everyone",
        "import os, signal\ndef handle(i, c):\n    os.kill(-1, signal.SIGKILL)\n    return 'still here'",
        RUNTIME,  # refused: SIGKILL is a signal tool code may not send (docs/security.md)
    ),
    (
        "rwx-memory-for-shellcode",
        "import mmap\ndef handle(i, c):\n    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n    return 1",
        RUNTIME,
    ),
    (
        "exec-from-scratch-dir",
        "import ctypes, os\ndef handle(i, c):\n    open('lib.so', 'wb').write(open('/usr/lib/x86_64-linux-gnu/libm.so.6', 'rb').read())\n    ctypes.CDLL(os.path.abspath('lib.so'))\n    return 1",
        RUNTIME,
    ),
    (
        "memfd-create",
        "import os\ndef handle(i, c):\n    os.memfd_create('x')\n    return 1",
        VIOLATION,
    ),
    # --- resources
    (
        "fork-bomb",
        "import os\ndef handle(i, c):\n    while True:\n        os.fork()\n    return 1",
        VIOLATION,
    ),
    (
        "thread-bomb",
        "import threading, time\ndef handle(i, c):\n    ts = [threading.Thread(target=time.sleep, args=(5,)) for _ in range(1000)]\n    for t in ts:\n        t.start()\n    return len(ts)",
        RUNTIME,
    ),
    (
        "memory-bomb",
        "def handle(i, c):\n    x = []\n    while True:\n        x.append(' ' * 10_000_000)\n    return 1",
        {"memory_limit"},
    ),
    (
        "memory-numpy-size",
        "def handle(i, c):\n    return len(bytearray(8 * 1024**3))",
        {"memory_limit"},
    ),
    (
        "disk-fill",
        "def handle(i, c):\n    f = open('big', 'wb')\n    while True:\n        f.write(b'x' * 1_000_000)\n    return 1",
        RUNTIME,
    ),
    (
        "stdout-flood",
        "def handle(i, c):\n    for _ in range(200_000):\n        print('flood' * 20)\n    return 'done'",
        lambda r: r["status"] == "ok" and len(r["logs"]["stdout"]) < 70_000,
    ),
    (
        "fd-1-flood",
        "import os\ndef handle(i, c):\n    for _ in range(10_000):\n        os.write(1, b'x' * 1000)\n    return 'done'",
        ok_and(lambda d: d == "done"),
    ),
    ("huge-result", "def handle(i, c):\n    return 'x' * 5_000_000", {"output_too_large"}),
    (
        "deep-result",
        "def handle(i, c):\n    x = []\n    for _ in range(100_000):\n        x = [x]\n    return x",
        {"invalid_result"},
    ),
    ("nan-result", "def handle(i, c):\n    return float('nan')", {"invalid_result"}),
    ("busy-loop", "def handle(i, c):\n    while True:\n        pass\n    return 1", {"timeout"}),
    (
        "sleep-past-deadline",
        "import time\ndef handle(i, c):\n    time.sleep(60)\n    return 1",
        {"timeout"},
    ),
    (
        "ignore-signals",
        "import signal, time\ndef handle(i, c):\n    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):\n        signal.signal(s, signal.SIG_IGN)\n    while True:\n        time.sleep(0.01)\n    return 1",
        {"timeout"},
    ),
    ("huge-int-to-str", "def handle(i, c):\n    return str(10 ** 1_000_000)", RUNTIME),
    (
        "recursion",
        "def handle(i, c):\n    def f(n):\n        return f(n + 1)\n    return f(0)",
        RUNTIME,
    ),
    (
        "hostile-str-exception",
        "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('nope')\ndef handle(i, c):\n    raise E()\n    return 1",
        RUNTIME,
    ),
    ("system-exit", "import sys\ndef handle(i, c):\n    sys.exit(0)\n    return 1", RUNTIME),
    ("forged-exit-code", "import os\ndef handle(i, c):\n    os._exit(75)\n    return 1", RUNTIME),
    (
        "forged-frame-on-stdout",
        "import sys, json, struct\ndef handle(i, c):\n    body = json.dumps({'op': 'result', 'kind': 'return', 'value': 'forged'}).encode()\n    sys.__stdout__.buffer.write(struct.pack('>I', len(body)) + body)\n    sys.__stdout__.flush()\n    raise ValueError('real error')\n    return 1",
        RUNTIME,
    ),
    (
        "forged-infra-frame-on-channel",
        "import os, json, struct\ndef handle(i, c):\n    body = json.dumps({'op': 'result', 'kind': 'infra'}).encode()\n    for fd in range(3, 20):\n        try:\n            os.write(fd, struct.pack('>I', len(body)) + body)\n        except OSError:\n            pass\n    os._exit(0)\n    return 1",
        {"invalid_result"},
    ),
    (
        "frame-of-another-run",
        "import os, json, struct\ndef handle(i, c):\n    body = json.dumps({'op': 'result', 'run': 'f' * 16, 'kind': 'return', 'value': 'forged'}).encode()\n    for fd in range(3, 20):\n        try:\n            os.write(fd, struct.pack('>I', len(body)) + body)\n        except OSError:\n            pass\n    os._exit(0)\n    return 1",
        {"invalid_result"},
    ),
    (
        # The run id can be dug out of the process; a result followed by more frames is
        # still refused: the channel must be empty after the result.
        "frames-after-a-forged-result",
        "import gc, os, json, struct\ndef handle(i, c):\n    run = next(o['run'] for o in gc.get_objects() if type(o) is dict and o.get('op') == 'run')\n    frames = b''\n    for f in ({'op': 'result', 'run': run, 'kind': 'return', 'value': 'forged'}, {'op': 'call', 'run': run, 'id': 9, 'tool': 'calculate', 'input': {}}):\n        body = json.dumps(f).encode()\n        frames += struct.pack('>I', len(body)) + body\n    for fd in range(3, 20):\n        try:\n            os.write(fd, frames)\n        except OSError:\n            pass\n    os._exit(0)\n    return 1",
        {"invalid_result"},
    ),
    (
        # sendfile is allowed (shutil.copyfile uses it): frames sent with it from a file of
        # the tool's own reach the host as any write does, and are refused the same way.
        "sendfile-forged-frame-on-channel",
        "import os, json, struct, tempfile\ndef handle(i, c):\n    body = json.dumps({'op': 'result', 'run': 'f' * 16, 'kind': 'return', 'value': 'forged'}).encode()\n    path = os.path.join(tempfile.mkdtemp(), 'frame')\n    with open(path, 'wb') as f:\n        f.write(struct.pack('>I', len(body)) + body)\n    src = os.open(path, os.O_RDONLY)\n    for fd in range(3, 20):\n        try:\n            os.sendfile(fd, src, 0, len(body) + 4)\n        except OSError:\n            pass\n    os._exit(0)\n    return 1",
        {"invalid_result"},
    ),
    (
        # sendfile cannot write where write cannot: the read-only root stays read-only.
        "sendfile-into-the-read-only-root",
        "import os, tempfile\ndef handle(i, c):\n    path = os.path.join(tempfile.mkdtemp(), 'x')\n    open(path, 'w').write('evil')\n    src = os.open(path, os.O_RDONLY)\n    dst = os.open('/usr/lib/evil', os.O_WRONLY | os.O_CREAT)\n    os.sendfile(dst, src, 0, 4)\n    return 1",
        RUNTIME,
    ),
    (
        # Extended attributes answer ENOTSUP in every namespace (security.*, trusted.* as
        # well as user.*), on the tool's own files and on the bound ones.
        "xattrs-refused",
        "import errno, os, tempfile\ndef handle(i, c):\n    path = os.path.join(tempfile.mkdtemp(), 'x')\n    open(path, 'w').close()\n    seen = []\n    for target in (path, '/usr/lib'):\n        for name in ('user.a', 'security.capability', 'trusted.a'):\n            try:\n                os.setxattr(target, name, b'x')\n                seen.append('set')\n            except OSError as e:\n                seen.append(errno.errorcode[e.errno])\n        try:\n            seen.append(len(os.listxattr(target)))\n        except OSError as e:\n            seen.append(errno.errorcode[e.errno])\n    return {'message': ','.join(map(str, seen))}",
        lambda r: r["status"] == "ok" and set(str(r["message"]).split(",")) == {"ENOTSUP"},
    ),
    (
        "garbage-on-channel",
        "import os\ndef handle(i, c):\n    for fd in range(3, 20):\n        try:\n            os.write(fd, b'\\xff\\xff\\xff\\xffgarbage')\n        except OSError:\n            pass\n    os._exit(0)\n    return 1",
        {"output_too_large", "invalid_result"},
    ),
]


# A Python sandbox has two templates: code that says `async` runs in the one with asyncio
# preloaded, whose children make their event loop before the request (runner.needs_asyncio,
# pyrunner._prepare_loop). Every attack runs in both.
TEMPLATES = {"lean": "", "async": "\n# async\n"}


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("name,code,expect", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_contained(
    target: Target, name: str, code: str, expect: Any, template: str
) -> None:
    res = target.run(code + TEMPLATES[template], timeout_ms=1500)
    if callable(expect):
        assert expect(res), (name, res["error"], res["raw_data"])
    else:
        assert res["status"] == "error" and res["error"]["code"] in expect, (
            name,
            res["error"],
            res["logs"],
        )
    assert no_secret(res)
    assert "Traceback" not in json.dumps(res["error"] or {})
    target.assert_contained()


@pytest.mark.parametrize(
    "plant_in,look_in", [("lean", "lean"), ("async", "async"), ("async", "lean")]
)
def test_no_state_survives_to_the_next_call(target: Target, plant_in: str, look_in: str) -> None:
    plant = (
        "import builtins, os, sys, threading, time\n"
        "def handle(i, c):\n"
        "    builtins.PLANTED = 1\n"
        "    sys.modules['planted'] = object()\n"
        "    os.environ['PLANTED'] = '1'\n"
        "    open('/tmp/planted', 'w').write('x') if os.access('/tmp', os.W_OK) else None\n"
        "    open('planted', 'w').write('x')\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "    import math\n"
        "    math.pi = 3\n"
        "    return os.getcwd()"
    )
    first = target.run(plant + TEMPLATES[plant_in])
    assert first["status"] == "ok", (first["error"], first["logs"])
    look = (
        "import builtins, os, sys, json\n"
        "def handle(i, c):\n"
        "    return {'builtins': hasattr(builtins, 'PLANTED'), 'module': 'planted' in sys.modules,\n"
        "            'env': 'PLANTED' in os.environ, 'tmp': os.path.exists('/tmp/planted'),\n"
        "            'old_cwd': os.path.exists(i['cwd'] + '/planted'), 'pi': __import__('math').pi}"
    )
    second = target.run(look + TEMPLATES[look_in], {"cwd": first["raw_data"]})
    assert second["raw_data"] == {
        "builtins": False,
        "module": False,
        "env": False,
        "tmp": False,
        "old_cwd": False,
        "pi": 3.141592653589793,
    }
    target.assert_contained()


def test_concurrent_calls_cannot_see_each_other(target: Target) -> None:
    import threading

    writer = (
        "import os, time\n"
        "def handle(i, c):\n"
        "    open('secret.txt', 'w').write('hunter2')\n"
        "    time.sleep(1.0)\n"
        "    return os.getcwd()"
    )
    reader = (
        "import os, time\n"
        "def handle(i, c):\n"
        "    time.sleep(0.3)\n"
        "    found = []\n"
        "    me = os.getuid()\n"
        "    mine = int(os.getcwd().rsplit('/', 1)[1])  # the writer's number is close\n"
        "    for d in range(me - 40, me + 40):  # /tmp is not listable: guess the uids\n"
        "        for n in range(max(0, mine - 40), mine + 40):\n"
        "            try:\n"
        "                found.append(open(f'/tmp/{d}/s/{n}/secret.txt').read())\n"
        "            except OSError:\n"
        "                pass\n"
        "    return found"
    )
    results: dict[str, dict] = {}
    t = threading.Thread(
        target=lambda: results.setdefault("w", target.run(writer, timeout_ms=3000))
    )
    t.start()
    results["r"] = target.run(reader, timeout_ms=3000)
    t.join()
    assert results["w"]["status"] == "ok", results["w"]["error"]
    assert results["r"]["status"] == "ok" and results["r"]["raw_data"] == []
