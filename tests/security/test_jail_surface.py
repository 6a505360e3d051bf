"""What the jail shows and allows, by class (docs/security.md): through the API, at full
strength. JavaScript code has no files, signals, memory mappings or syscalls of its own, so
these classes are Python's; the JavaScript jail is the same template (checked at the end)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import toolkiln
from tests.security.conftest import Target

# --- a tool cannot fake a death "from outside" (which would not count against it)

FORGED_DEATHS = {
    "kill-self-sigkill": "import os\ndef handle(i, c):\n    os.kill(os.getpid(), 9)",
    "kill-self-sigterm": "import os\ndef handle(i, c):\n    os.kill(os.getpid(), 15)",
    "kill-group-sigkill": "import os\ndef handle(i, c):\n    os.kill(0, 9)",
    "raise-sigterm": "import signal\ndef handle(i, c):\n    signal.raise_signal(signal.SIGTERM)",
    "raise-sigint": "import signal\ndef handle(i, c):\n    signal.raise_signal(signal.SIGINT)",
    "raise-sighup": "import signal\ndef handle(i, c):\n    signal.raise_signal(signal.SIGHUP)",
    "raise-sigquit": "import signal\ndef handle(i, c):\n    signal.raise_signal(signal.SIGQUIT)",
    "pthread-kill-sigkill": (
        "import signal, threading\n"
        "def handle(i, c):\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGKILL)"
    ),
    "tkill-syscall": (
        "import ctypes, os\n"
        "def handle(i, c):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    if libc.syscall(200, os.gettid(), 9) != 0:\n"
        "        raise OSError(ctypes.get_errno(), 'tkill')"
    ),
    "timer-with-sigkill": (
        "import ctypes, struct, time\n"
        "def handle(i, c):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    ev = ctypes.create_string_buffer(struct.pack('=qii', 0, 9, 0) + bytes(48))\n"
        "    tid = ctypes.c_void_p()\n"
        "    if libc.syscall(222, 1, ev, ctypes.byref(tid)) != 0:\n"  # timer_create
        "        raise OSError(ctypes.get_errno(), 'timer_create')\n"
        "    time.sleep(3)"
    ),
    "sigio-as-sigkill": (
        "import fcntl, os\n"
        "def handle(i, c):\n"
        "    r, w = os.pipe()\n"
        "    fcntl.fcntl(r, 10, 9)\n"  # F_SETSIG
        "    os.write(w, b'x')"
    ),
    "rlimit-cpu-to-one-second": (
        "import resource, signal\n"
        "def handle(i, c):\n"
        "    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "    resource.setrlimit(resource.RLIMIT_CPU, (1, 1))\n"
        "    while True:\n"
        "        pass"
    ),
    "ignore-sigxcpu-and-burn": (
        "import signal, threading\n"
        "def burn():\n"
        "    while True:\n"
        "        pass\n"
        "def handle(i, c):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXCPU})\n"
        "    for _ in range(3):\n"
        "        threading.Thread(target=burn, daemon=True).start()\n"
        "    burn()"
    ),
    "abort": "import os\ndef handle(i, c):\n    os.abort()",
    "sigusr1-unhandled": "import os\ndef handle(i, c):\n    os.kill(os.getpid(), 10)",
    "exit-code": "import os\ndef handle(i, c):\n    os._exit(1)",
}


@pytest.mark.parametrize("name", sorted(FORGED_DEATHS))
def test_a_tool_cannot_pass_its_own_death_off_as_infra(target: Target, name: str) -> None:
    """Whatever a tool does to itself is its failure (counted), never ``infra_error``."""
    res = target.run(FORGED_DEATHS[name] + "\n    return 'survived'", timeout_ms=2500)
    assert res["status"] == "error", res
    assert res["error"]["code"] in {"runtime_error", "timeout"}, (name, res["error"])
    target.assert_contained()


# --- no native code of the tool's own (W^X for every mapping)

NATIVE_CODE = {
    "private-rwx-map-of-a-library": (
        "import mmap\n"
        "def handle(i, c):\n"
        "    f = open('/usr/lib/x86_64-linux-gnu/libc.so.6', 'rb')\n"
        "    mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_PRIVATE,\n"
        "              prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    return 'mapped'"
    ),
    "shared-rwx-map-of-dev-zero": (
        "import mmap\n"
        "def handle(i, c):\n"
        "    f = open('/dev/zero', 'r+b')\n"
        "    mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_SHARED,\n"
        "              prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    return 'mapped'"
    ),
    "exec-map-of-dev-zero": (
        "import mmap\n"
        "def handle(i, c):\n"
        "    f = open('/dev/zero', 'rb')\n"
        "    mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_PRIVATE,\n"
        "              prot=mmap.PROT_READ | mmap.PROT_EXEC)\n"
        "    return 'mapped'"
    ),
    "exec-map-of-a-scratch-file": (
        "import mmap, os\n"
        "def handle(i, c):\n"
        "    with open('code.bin', 'wb') as f:\n"
        "        f.write(b'\\xc3' * 4096)\n"
        "    f = open('code.bin', 'rb')\n"
        "    mmap.mmap(f.fileno(), 4096, flags=mmap.MAP_PRIVATE,\n"
        "              prot=mmap.PROT_READ | mmap.PROT_EXEC)\n"
        "    return 'mapped'"
    ),
    "write-then-mprotect-exec": (
        "import ctypes, mmap\n"
        "def handle(i, c):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    libc.mmap.restype = ctypes.c_void_p\n"
        "    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,\n"
        "                          ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
        "    f = open('/usr/lib/x86_64-linux-gnu/libc.so.6', 'rb')\n"
        "    p = libc.mmap(None, 4096, 3, 2, f.fileno(), 0)\n"  # RW, MAP_PRIVATE
        "    ctypes.memset(p, 0xc3, 4096)\n"
        "    if libc.mprotect(ctypes.c_void_p(p), 4096, 5) != 0:\n"  # R+X
        "        raise OSError(ctypes.get_errno(), 'mprotect')\n"
        "    return 'executable'"
    ),
    "pkey-mprotect-exec": (
        "import ctypes, mmap\n"
        "def handle(i, c):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    m = mmap.mmap(-1, 4096)\n"
        "    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
        "    if libc.syscall(329, ctypes.c_void_p(addr), 4096, 7, -1) != 0:\n"
        "        raise OSError(ctypes.get_errno(), 'pkey_mprotect')\n"
        "    return 'executable'"
    ),
}


@pytest.mark.parametrize("name", sorted(NATIVE_CODE))
def test_no_memory_is_both_written_by_the_tool_and_executable(target: Target, name: str) -> None:
    res = target.run(NATIVE_CODE[name])
    assert res["status"] == "error", (name, res)
    assert res["error"]["code"] in {"runtime_error", "sandbox_violation"}, res["error"]
    if res["error"]["code"] == "runtime_error":
        assert res["error"]["details"]["type"] in {"PermissionError", "OSError"}, res["error"]


def test_native_extension_modules_still_load(target: Target) -> None:
    """Read-only executable mappings of library files (how extensions load) still work."""
    code = (
        "import _decimal, _ctypes, _sqlite3, _ssl, zlib\n"
        "def handle(i, c):\n"
        "    return str(_decimal.Decimal('1.10') + 2) + zlib.decompress(zlib.compress(b'!')).decode()"
    )
    res = target.run(code)
    assert res["status"] == "ok" and res["raw_data"] == "3.10!", res


# --- the futex operations behind the 2026 container escapes

PI_OPS = {"LOCK_PI": 6, "UNLOCK_PI": 7, "TRYLOCK_PI": 8, "WAIT_REQUEUE_PI": 11}
PI_OPS |= {"CMP_REQUEUE_PI": 12, "LOCK_PI2": 13}


@pytest.mark.parametrize("private", [0, 128])
@pytest.mark.parametrize("op", sorted(PI_OPS))
def test_priority_inheritance_futexes_are_refused(target: Target, op: str, private: int) -> None:
    code = (
        "import ctypes\n"
        "def handle(i, c):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    word = ctypes.c_uint32(0)\n"
        f"    r = libc.syscall(202, ctypes.byref(word), {PI_OPS[op] | private}, 0, None, None, 0)\n"
        "    return [r, ctypes.get_errno()]"
    )
    res = target.run(code)
    assert res["status"] == "ok" and res["raw_data"] == [-1, 38], res  # ENOSYS


def test_futex_waitv_kills_the_process(target: Target) -> None:
    code = (
        "import ctypes\n"
        "def handle(i, c):\n"
        "    return ctypes.CDLL(None).syscall(449, None, 0, 0, None, 1)"
    )
    res = target.run(code)
    assert res["status"] == "error" and res["error"]["code"] == "sandbox_violation", res


def test_plain_futexes_still_work(target: Target) -> None:
    """Threads, locks, conditions and asyncio use the ordinary futex operations."""
    code = (
        "import asyncio, threading, queue\n"
        "def handle(i, c):\n"
        "    q = queue.Queue()\n"
        "    ts = [threading.Thread(target=q.put, args=(n,)) for n in range(4)]\n"
        "    [t.start() for t in ts]; [t.join() for t in ts]\n"
        "    cond = threading.Condition()\n"
        "    with cond:\n"
        "        cond.wait(0.01)\n"
        "    async def two():\n"
        "        await asyncio.sleep(0)\n"
        "        return 2\n"
        "    return sorted(q.get() for _ in range(4)) + [asyncio.run(two())]"
    )
    res = target.run(code)
    assert res["status"] == "ok" and res["raw_data"] == [0, 1, 2, 3, 2], res


# --- nothing of the host: its paths, counters and Python packages

HOST_VIEWS = [
    "/proc/self/mountinfo",
    "/proc/self/mounts",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/meminfo",
    "/proc/uptime",
    "/proc/cpuinfo",
    "/proc/self/maps",
    "/sys/fs/cgroup/cgroup.controllers",
    "/sys/devices/system/cpu/online",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/etc/hostname",
    "/etc/mtab",
]


def test_no_host_paths_or_host_wide_counters_are_readable(target: Target) -> None:
    code = (
        f"PATHS = {HOST_VIEWS!r}\n"
        "import ctypes, os\n"
        "def handle(i, c):\n"
        "    seen = []\n"
        "    for p in PATHS:\n"
        "        try:\n"
        "            seen.append([p, open(p).read(200)])\n"
        "        except OSError:\n"
        "            pass\n"
        "    try:\n"
        "        seen.append(['loadavg', os.getloadavg()])\n"
        "    except OSError:\n"
        "        pass\n"
        "    seen.append(['pages', os.sysconf('SC_PHYS_PAGES'), os.sysconf('SC_AVPHYS_PAGES')])\n"
        "    buf = ctypes.create_string_buffer(128)\n"
        "    if ctypes.CDLL(None).sysinfo(buf) == 0:\n"
        "        seen.append(['sysinfo', buf.raw[:16].hex()])\n"
        "    return seen"
    )
    res = target.run(code)
    assert res["status"] == "ok", res
    # glibc's sysconf answers from sysinfo(), which is refused: whatever it returns is not
    # the host's memory size.
    pages = res["raw_data"].pop()
    assert pages[0] == "pages" and os.sysconf("SC_PHYS_PAGES") not in pages, pages
    assert res["raw_data"] == [], res
    assert str(target.data_dir) not in str(res)


def test_no_host_python_package_imports(target: Target) -> None:
    """Only the standard library and the curated list: the interpreter's site-packages and
    Debian's python3 trees are empty in the jail, even added to sys.path by hand."""
    stdlib = f"{sys.base_prefix}/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    dirs = [f"{stdlib}/site-packages", "/usr/lib/python3/dist-packages", "/usr/lib/python3"]
    dirs += ["/usr/lib/python3.11", sys.prefix, f"{sys.prefix}/lib/python3.11/site-packages"]
    dirs = [d for d in dirs if d != stdlib]  # (Debian's python3: the standard library itself)
    names = ["pip", "setuptools", "_pytest", "pytest", "fastapi", "sqlalchemy", "toolkiln"]
    names += ["yaml", "jwt", "pygments", "OpenSSL", "dbus", "gi"]
    code = (
        f"DIRS, NAMES = {dirs!r}, {names!r}\n"
        "import importlib, os, sys\n"
        "def handle(i, c):\n"
        "    sys.path[:0] = DIRS\n"
        "    found = [d for d in DIRS if os.path.isdir(d) and os.listdir(d)]\n"
        "    for n in NAMES:\n"
        "        try:\n"
        "            importlib.import_module(n)\n"
        "            found.append(n)\n"
        "        except ImportError:\n"
        "            pass\n"
        "    return found"
    )
    res = target.run(code)
    # yaml is curated: it imports only once the host installed it into /pkgs, never from the
    # host's own trees; nothing else in NAMES is curated.
    assert res["status"] == "ok", res
    assert [n for n in res["raw_data"] if n != "yaml"] == [], res
    if "yaml" in res["raw_data"]:
        check = target.run("import yaml\ndef handle(i, c):\n    return yaml.__file__")
        assert check["raw_data"].startswith("/pkgs/"), check


def test_only_the_native_libraries_of_usr_lib_are_there(target: Target) -> None:
    """/usr/lib holds the host's other software (browsers, databases, JVMs): not bound."""
    code = (
        "import os\ndef handle(i, c):\n    return [sorted(os.listdir('/usr/lib')), os.listdir('/')]"
    )
    res = target.run(code)
    assert res["status"] == "ok", res
    usr_lib, root = res["raw_data"]
    # (Debian's python3 has its standard library there, bound as it must be.)
    stdlib = f"{sys.base_prefix}/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    own = [Path(stdlib).name] if Path(stdlib).parent == Path("/usr/lib") else []
    assert usr_lib == sorted(["x86_64-linux-gnu", *own]), usr_lib
    assert "proc" not in root and "sys" not in root, root


def test_healthz_reports_the_kernel_next_to_the_layers(target: Target) -> None:
    body = target.client.get("/healthz").json()
    for language in ("python", "javascript"):
        isolation = body["runtimes"][language]["isolation"]
        assert isolation["kernel"] == os.uname().release
        assert isolation["seccomp"] == "allowlist" and isolation["readonly_root"] is True


def test_the_templates_command_line_is_not_shown(target: Target) -> None:
    """The template was started with host paths (the repository, the venv, the data
    directory) and its whole configuration on its command line: every child showed them as
    sys.argv, sys.orig_argv and sys.executable (until 2026-12-06)."""
    code = (
        "import sys\n"
        "def handle(i, c):\n"
        "    return [sys.argv, sys.orig_argv, sys.executable, sys._base_executable]"
    )
    res = target.run(code)
    assert res["status"] == "ok", res
    shown = json.dumps(res["raw_data"])
    repository = str(Path(toolkiln.__file__).resolve().parents[2])
    for host in (repository, sys.prefix, str(target.data_dir), "uid_base", "template.py"):
        assert host not in shown, (host, shown)


def test_a_run_that_closes_its_channel_at_its_deadline_ends_as_a_timeout(target: Target) -> None:
    """Its exit is waited for no later than its deadline: a tool that closed its end of the
    channel just before it and went on held its place 2 s past it and ended as a crash whose
    exit status was unknown (until 2026-12-06)."""
    code = (
        "import socket, time\n"
        "def main(*, ctx, **p):\n"
        "    time.sleep(0.9)\n"
        "    ctx._link.sock.shutdown(socket.SHUT_WR)\n"
        "    time.sleep(5)\n"
        "    return {'message': 'never'}\n"
    )
    res = target.run(code, timeout_ms=1000)
    assert res["error"] is not None and res["error"]["code"] == "timeout", res["error"]
    target.assert_contained()
