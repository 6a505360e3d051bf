"""Runs JavaScript tool calls in a long-lived jailed worker, a fresh V8 context each.

Starting V8 costs ~40-60 ms of CPU, so it starts once, in the JavaScript template
(single-threaded: a fork carries the whole engine), and each worker is a fork of that. A
new worker still spends ~10 ms on its first isolate, against ~2 ms for each later one, so a
worker lives for several calls (the host recycles it after a few dozen, and kills it on any
timeout or crash). Each call gets a new V8 isolate and context: no global, prototype or
pending promise reaches the next call. The engine is a convenience; the jail around the
worker (namespaces, read-only root, uid, seccomp, cgroup) is the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import resource
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import protocol
from pyrunner import result_frame

if TYPE_CHECKING:
    from config import JailConfig


def _source(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", f"{name}.js")) as f:
        return f.read()


# The JavaScript of every call's context, in files of its own (js/): the prelude, the
# set-up made while the worker is idle, and the wrapper of each entry point. Read once,
# when the template imports this module (before its new root hides the host's files).
PRELUDE, SETUP, ENTRY = (_source(name) for name in ("prelude", "setup", "entry"))

ENTRIES = ("main", "handle")


@functools.lru_cache(maxsize=4)
def _setup_script(log_cap: int, listed: tuple) -> str:
    runners = ", ".join(f"__tk_run_{n}: {ENTRY.replace('__ENTRY__', n)}" for n in ENTRIES)
    prelude = PRELUDE.replace("__TK_LOG_CAP__", str(int(log_cap)))
    return f"{prelude}\n({SETUP})({_literal(listed)}, {{{runners}}});"


def _isolate(mr_module: Any) -> Any:
    """A new isolate and context, without the ``setTimeout`` script ``MiniRacer()`` evaluates
    in each (~0.35 ms; the prelude removes what it installs anyway)."""
    return _bare_class(mr_module)()


@functools.lru_cache(maxsize=2)
def _bare_class(mr_module: Any) -> Any:
    """``MiniRacer`` made with mini-racer's own (private, 0.14) context maker and nothing
    evaluated in it; the public class where that maker is not there."""
    make = getattr(getattr(mr_module, "_mini_racer", None), "_make_context", None)
    if make is None:
        return mr_module.MiniRacer
    maker: Callable[[], Any] = make

    class Bare(mr_module.MiniRacer):
        def __init__(self) -> None:
            self._own_context_maker = maker()
            self._ctx = self._own_context_maker.__enter__()

    return Bare


def preload(mr_module: object) -> None:
    """Warm V8 (a first isolate, ``Intl``, a host callback) and libffi's closure pool before
    seccomp forbids executable memory: run once in the template, inherited by each worker."""

    async def noop(*args: object) -> str:
        return "null"

    async def warm() -> None:
        # A context binds to the running loop: make it inside the coroutine.
        mr = mr_module.MiniRacer()  # type: ignore[attr-defined]
        try:
            mr.eval(
                "new Intl.NumberFormat('en-US', {style: 'currency', currency: 'USD'}).format(1)"
            )
            async with mr.wrap_py_function(noop) as fn:
                await mr.eval("(f) => f('x', 'null')")(fn)
        finally:
            mr.close()

    asyncio.run(warm())


def _where(message: str) -> tuple[int | None, int | None]:
    for match in re.finditer(r"<anonymous>:(\d+):(\d+)", message):
        return int(match.group(1)), int(match.group(2))
    return None, None


# mini-racer's text for a JavaScript value it hands Python as an object: its Python repr,
# with a heap address. A rejection reaches Python through mini-racer's own await, which
# calls the promise's ``then``: code that replaced ``Promise.prototype.then`` can reject
# with any value there, past ``__tk_wellformed``.
_WRAPPER = re.compile(r"<py_mini_racer\.[\w.]+ object at 0x[0-9a-fA-F]+>")


def _error(exc: BaseException) -> dict:
    text = _WRAPPER.sub("a value that is not an Error", str(exc))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    first = first.removeprefix("JavaScript rejected promise with reason: ")
    line, column = _where(text)
    # Errors thrown while the script loads read "<anonymous>:7 Error: ...".
    located = re.match(r"<anonymous>:(\d+)(?::(\d+))?:?\s*", first)
    if located:
        line = line or int(located.group(1))
        first = first[located.end() :]
    kind, _, message = first.partition(": ")
    name = type(exc).__name__
    if name == "JSOOMException":
        return {
            "kind": "exception",
            "type": "MemoryError",
            "message": "JavaScript heap limit reached",
        }
    if name == "JSParseException":
        kind = "SyntaxError"
    if name == "JSPromiseError":  # a rejection that was no Error of ours: mini-racer's name
        name = "Error"
    return {
        "kind": "exception",
        "type": (kind if message else name)[:100],
        "message": (message or first)[:2000],
        "line": line,
        "column": column,
    }


LOG_CAP = 65536
MAX_ANSWERS = 1024  # ctx calls answered per call: the host allows 1000 frames a run
NO_LOGS = {"out": [], "err": [], "dropped": 0}
MEMORY = {"kind": "exception", "type": "MemoryError", "message": "JavaScript heap limit reached"}


class Fresh:
    """An isolate made while the worker is idle, after the previous call's report was sent:
    a new V8 isolate and context with the prelude and SETUP evaluated, so that a call brings
    only its code and its data. It serves at most one call (``link`` is set once, for it):
    ``answer_all`` makes the ctx calls the call queued, ``release`` ends its link before the
    report goes out, ``close`` frees the isolate after it."""

    def __init__(self, mr: Any, log_cap: int) -> None:
        self.mr = mr
        self.log_cap = log_cap
        self.link = None

    @classmethod
    async def make(
        cls, mr_module: object, heap_bytes: int, listed: list, log_cap: int = LOG_CAP
    ) -> Fresh:
        # Made inside a coroutine: an isolate binds to the running loop (the worker's own).
        fresh = cls(_isolate(mr_module), log_cap)
        mr = fresh.mr
        try:
            mr.set_hard_memory_limit(heap_bytes)
            # One script: the prelude and SETUP. No host callback is wrapped: a ctx call waits
            # in the isolate's queue until ``answer_all`` takes it (wrapping one cost ~0.5 ms
            # of the worker's CPU per isolate, so per call:
            # docs/decisions/115-javascript-ctx-queue.md).
            mr.eval(_setup_script(log_cap, tuple(listed)))
        except BaseException:
            await fresh.close()
            raise
        return fresh

    def _answer(self, name_json: object, input_json: object) -> str:
        """One queued ctx call made: the arguments of its ``__tk_answer``, whether it
        succeeded and, as a JavaScript string literal, its answer's JSON text or why it
        failed. What the isolate queued is tool-made text: parsed here like any frame."""
        link = self.link
        try:
            if link is None:
                raise RuntimeError("no call is running")
            name, payload = json.loads(str(name_json)), json.loads(str(input_json))
            if name == "__audit__":
                event, data = (
                    payload if isinstance(payload, list) and len(payload) == 2 else (None, None)
                )
                link.audit(event, data)
                return f"true, {_literal(None)}"
            return f"true, {_literal(link.call(name, payload))}"
        except Exception as exc:
            return f"false, {json.dumps(str(exc)[:2000])}"

    def answer_all(self) -> None:
        """Make the ctx calls the call queued, in the order it made them, answering each into
        the isolate (its continuation runs there and may queue more), until none is left or
        MAX_ANSWERS were answered (the host ends a run past its own cap of ctx frames, so
        what is left could only fail). Each is made to its end before the next, as the host
        side of a call never awaits. Only calls queued during these crossings into V8 are
        made: the isolate runs nothing between them (no timers, no tasks of its own)."""
        mr = self.mr
        answered = 0
        while answered < MAX_ANSWERS:
            queued = json.loads(str(mr.eval("__tk_take()")))
            if not isinstance(queued, list) or not queued or len(queued) > 64:
                return
            for item in queued:
                if not (
                    isinstance(item, list)
                    and len(item) == 3
                    and type(item[0]) is int
                    and isinstance(item[1], str)
                    and isinstance(item[2], str)
                ):
                    return  # not what SETUP queues: nothing more is answered
                mr.eval(f"__tk_answer({item[0]}, {self._answer(item[1], item[2])})")
                answered += 1

    def release(self) -> None:
        """The link ends here: a ctx call still queued is never made."""
        self.link = None

    async def close(self) -> None:
        self.release()
        self.mr.close()


def _literal(value: object) -> str:
    """``value`` as JSON text, spelled as a JavaScript string literal (ASCII only)."""
    return json.dumps(json.dumps(value))


def _returned(text: str) -> dict:
    if text.startswith("!"):
        return {"kind": "unserializable", "message": f"{text[1:]}."}
    return {"kind": "return", "value": json.loads(text)}


async def _run(fresh: Fresh, req: dict, link) -> tuple[dict, dict | None]:
    """The report of one call, and its logs if they were read with its value."""
    mr = fresh.mr
    fresh.link = link
    if req.get("modules"):
        sources = {}
        for name, path in req["modules"].items():
            with open(path, encoding="utf-8") as f:  # under /pkgs, read-only
                sources[name] = f.read()
        mr.eval(f"__tk_modules({_literal(sources)})")
    try:
        mr.eval(req["code"])
    except Exception as exc:
        return _error(exc), None
    entry = req["entry"]
    if entry not in ENTRIES:
        return {"kind": "exception", "type": "ReferenceError", "message": "no entrypoint"}, None
    inputs = f"{_literal(req.get('input') or {})}, {_literal(req.get('context') or {})}"
    try:
        value = mr.eval(f"__tk_run_{entry}({inputs})")
        if value is None:  # returned at once: its value and the logs in one read
            issued, logs, text = str(mr.eval("__tk_report()")).split("\n", 2)
            if int(issued):
                # Microtasks issued ctx calls after the value was returned: they run before
                # the report, as they did while the value was awaited; the logs are read again.
                fresh.answer_all()
                logs = mr.eval("__tk_logs()")
            return _returned(text), json.loads(logs)
        # A promise: an async entry, ctx calls in flight, or an error. Resolved once its ctx
        # calls are answered, unless it was rejected or still waits: then awaited, as before
        # (mini-racer's await of a promise cost an async entry ~1 ms of CPU per call:
        # docs/decisions/115-javascript-ctx-queue.md).
        queued, logs, text = str(mr.eval("__tk_done()")).split("\n", 2)
        if int(queued):
            fresh.answer_all()
            queued, logs, text = str(mr.eval("__tk_done()")).split("\n", 2)
        if text:
            return _returned(text), json.loads(logs)
        text = await value
    except Exception as exc:
        if mr.was_hard_memory_limit_reached():
            return dict(MEMORY), None
        return _error(exc), None
    return _returned(str(text)), None


async def _prepare(mr_module: object, heap: int, listed: list, log_cap: int = LOG_CAP):
    try:
        return await Fresh.make(mr_module, heap, listed, log_cap)
    except Exception:
        return None  # made again, and its error reported, when a call needs it


async def _renew(spent: list, mr_module: object, heap: int, listed: list):
    """Off the call's path, while idle: the next call's isolate made, then the used one
    closed, both before any other call runs, even one already waiting: what the used isolate
    still holds (its heap, its ArrayBuffers) must never count against the next call's
    memory (tests/sandbox/test_javascript_sandbox.py)."""
    fresh = await _prepare(mr_module, heap, listed)
    while spent:
        await spent.pop(0).close()
    return fresh


async def _one(box: list, mr_module: object, req: dict, link, heap: int, listed: list):
    """One call in its own isolate: ``box[0]``, prepared, or one made now and put there
    (whoever holds the box closes it once the report is sent). Before the report goes
    out, nothing the call started is left running: its ctx calls were made (or are never
    made), and any task of the worker's loop is cancelled (what ``asyncio.run`` did per
    call)."""
    try:
        log_cap = int(req.get("log_cap", LOG_CAP))
        if box[0] is None or box[0].log_cap != log_cap:
            if box[0] is not None:
                await box[0].close()
            box[0] = None
            box[0] = await Fresh.make(mr_module, heap, listed, log_cap)
        report, logs = await _run(box[0], req, link)
        box[0].release()
        if logs is None:
            logs = json.loads(box[0].mr.eval("__tk_logs()"))
    except Exception as exc:
        report, logs = _error(exc), NO_LOGS
    await _settle()
    return report, logs


async def _settle() -> None:
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def serve(sock: socket.socket, cfg: JailConfig, mr_module: object, link_factory) -> None:
    """Serve calls until the host closes the control channel (or kills us).

    The control channel only ever carries one byte per call with the call's own channel
    attached (SCM_RIGHTS); the call's request, ctx frames and result travel on that channel,
    which is closed when the call ends, so no byte of one call can be read by the next."""
    heap = cfg.js_heap_mb * 1024 * 1024
    listed = list(cfg.js_listed)
    loop = asyncio.new_event_loop()
    fresh = loop.run_until_complete(_prepare(mr_module, heap, listed))
    spent: list[Fresh] = []  # used isolates, not yet closed (one at most between calls)
    if cfg.warm_up:
        used = _rehearse(cfg, mr_module, link_factory, heap, listed, loop, fresh)
        if used is not None:
            spent.append(used)
        fresh = loop.run_until_complete(_renew(spent, mr_module, heap, listed))
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1, 1)
        except OSError:
            return
        if not msg or len(fds) != 1:
            return  # not the host's way of starting a call: stop serving
        # The host made it with socketpair(AF_UNIX, SOCK_STREAM) (js_runner._open_channel):
        # named here, so the socket module does not ask the kernel (three syscalls a call).
        chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fds[0])
        link = link_factory(chan, cfg.max_reply_bytes)
        box = [fresh]  # the call's isolate: used by this call alone, closed after it
        try:
            _answer(chan, cfg, mr_module, link, heap, listed, loop, box, sock)
        except (OSError, protocol.FrameError):
            pass  # the host gave up on this call (and will retire us if it must)
        finally:
            chan.close()
        if _closed(sock):
            return  # spent (see spent): the host retires us
        if box[0] is not None:
            spent.append(box[0])
        fresh = loop.run_until_complete(_renew(spent, mr_module, heap, listed))


REHEARSAL = {
    "op": protocol.RUN,
    "run": "rehearsal",
    "code": "function main(params) { return { message: 'ok' }; }",
    "entry": "main",
    "input": {},
    "timeout_ms": 1000,
    "context": {},
}


def _rehearse(cfg: JailConfig, mr_module: object, link_factory, heap, listed, loop, fresh):
    """A call of the worker's own, on a channel of its own, through the whole path a call
    takes (its request read, an isolate's run, its report sent) before any caller's: a
    fresh worker's first call paid its first touches (copy-on-write of the engine's and the
    interpreter's pages) and took ~2 ms more than the next ones
    (docs/decisions/113-javascript-isolates-made-ahead.md). No tool byte runs; the isolate it used
    is returned to be closed, and the caller's first call gets a new one."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    box = [fresh]
    try:
        with contextlib.suppress(Exception):  # a rehearsal that fails costs nothing else
            protocol.send(theirs, REHEARSAL)
            link = link_factory(mine, cfg.max_reply_bytes)
            _answer(mine, cfg, mr_module, link, heap, listed, loop, box)
    finally:
        mine.close()
        theirs.close()
    return box[0]


def spent(cfg: JailConfig) -> bool:
    """Whether this worker's CPU time (its RLIMIT_CPU is for its whole life, child.py) has
    less than one call's limit left: a next call could be killed for time it did not use."""
    if not cfg.worker_cpu_s:
        return False
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime > cfg.worker_cpu_s - cfg.max_cpu_s


def _closed(sock: socket.socket) -> bool:
    return sock.fileno() < 0


def _answer(
    chan: socket.socket, cfg: JailConfig, mr_module: object, link, heap, listed, loop, box, ctl=None
):
    req = link.reader.recv(cfg.max_request_bytes)
    if not isinstance(req, dict) or req.get("op") != protocol.RUN:
        return
    link.run = req.get("run")
    report, logs = loop.run_until_complete(_one(box, mr_module, req, link, heap, listed))
    marker = f"\n[truncated: {logs['dropped']} more bytes]" if logs.get("dropped") else ""
    report.update(
        op=protocol.RESULT,
        run=link.run,
        stdout="".join(logs["out"]) + marker,
        stderr="".join(logs["err"]),
    )
    if ctl is not None and spent(cfg):
        # Before the report: the host, which gives a worker back only while its control
        # channel is silent, sees this close once it has read the report, and retires us.
        ctl.close()
    chan.sendall(result_frame(report, link.run, cfg.max_result_bytes))
