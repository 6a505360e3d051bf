"""The code checker: a program of its own that parses untrusted tool code for a runner.

Started by ``sandbox/checks.py`` as ``python -I -m toolkiln.sandbox.checker MEMORY_MB CPU_S
PARENT_PID STRICT`` with an empty environment, its socket as descriptor 0 and nothing else
open: a fresh interpreter, not a fork of the runner, so it holds none of the runner's
memory, settings or credential. It loads and exercises everything parsing needs, then
confines itself before any tool's text arrives: nobody (when started as root), no core
files, no files written, an address-space and a data limit, a CPU-time limit for its whole
life, and a seccomp allowlist that leaves it computing and talking on its socket
(``seccomp.checker_filter``). Then, for each request frame ``{"language", "code"}``, one
answer frame: the ``Analysis`` (domain/analysis.py) on the wire, or ``{"limit": "memory"}``
after which it exits. Frames are the jail protocol's (4-byte length, UTF-8 JSON).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import sys
import warnings
from collections.abc import Callable
from typing import Any

from toolkiln.sandbox.jail import protocol, seccomp

NOBODY = 65534
PR_SET_PDEATHSIG = 1
# A request holds at most 256K characters of code, as JSON (an escaped control character
# takes six bytes).
MAX_REQUEST_BYTES = 2 * 1024 * 1024
READY = {"op": "ready"}
MEMORY = {"limit": "memory"}

# Text that makes the parsers load everything they load lazily (unicodedata for \N{...} and
# non-ASCII names, the warnings machinery, every error path), so none of it is loaded after
# the filter is installed.
_WARM_UP = (
    ("python", "import a.b\nfrom c import d\n\u00e9 = '\\N{LATIN SMALL LETTER A}\\d'\n"
               "def handle(i, c):\n    return [f'{x=}{b\"y\"!r:>{3}}' async for x in i]\n"),
    ("python", "def main(:\n"),
    ("python", "x = " + "(" * 300),
    ("python", "x = " + "-" * 20000 + "1\ndef main():\n    return x\n"),
    ("python", "def main():\n    pass\n"),
    ("javascript", "import a, { b as c } from 'm'; import * as n from 'n'; import 'o';\n"
                   "export async function handle(i, c) { return require('x') }\n"),
    ("javascript", "function main( {"),
    ("javascript", "const main = () => { }"),
)  # fmt: skip


def _confine(memory_mb: int, cpu_s: int, parent: int, strict: bool) -> None:
    if os.geteuid() == 0:  # never the runner's root: nobody, no groups
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    # After setresuid, which clears it: the checker dies with the thread that started it.
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(0)  # the runner ended before the line above
    memory = memory_mb << 20
    for limit, value in (
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_DATA, memory),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_NOFILE, 8),
    ):
        resource.setrlimit(limit, (value, value))
    # Past the soft limit SIGXCPU ends it (the host reads that as "took too long"), past the
    # hard one SIGKILL: a backstop under the host's wall-clock deadline for each request.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    try:
        seccomp.Installer(seccomp.checker_filter(os.getpid())).install()
    except (OSError, RuntimeError):
        if strict:
            raise


def _request(frame: Any) -> tuple[str, str]:
    if not isinstance(frame, dict) or set(frame) != {"language", "code"}:
        raise ValueError("a request is {language, code}")
    language, code = frame["language"], frame["code"]
    if not isinstance(language, str) or not isinstance(code, str):
        raise ValueError("a request's language and code are strings")
    return language, code


def serve(sock: socket.socket, analyse: Callable[[str, str], Any]) -> None:
    reader = protocol.Reader(sock)
    while True:
        try:
            language, code = _request(reader.recv(MAX_REQUEST_BYTES))
        except (protocol.FrameError, ValueError):
            return  # the host closed, or is not one: nothing more to do
        try:
            answer = analyse(language, code).to_wire()
        except MemoryError:
            answer = MEMORY
        sock.sendall(protocol.encode(answer))
        if answer is MEMORY:
            return  # whatever it held is gone with it


def main(argv: list[str]) -> int:
    memory_mb, cpu_s, parent, strict = (int(a) for a in argv[:4])
    from toolkiln.domain.code_check import analyse  # the parsers: in this program only

    warnings.simplefilter("ignore")
    for language, code in _WARM_UP:
        analyse(language, code)
    sock = socket.socket(fileno=0)
    _confine(memory_mb, cpu_s, parent, bool(strict))
    sock.sendall(protocol.encode(READY))
    serve(sock, analyse)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
