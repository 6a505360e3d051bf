"""Runs one Python tool call inside a jailed child and reports what happened as one frame.

The report is only evidence: the host validates it and decides the outcome.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import io
import marshal
import os
import socket
import sys
import warnings
from collections.abc import Iterator
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any

import protocol

if TYPE_CHECKING:
    from config import JailConfig

TOOL_FILE = "<tool>"
# What a tool usually returns, never awaitable (inspect.isawaitable asks the Awaitable ABC).
PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})
# Each preloaded module makes every fork (and exit) dearer: on the reference VM the full
# stdlib set cost ~1.4 ms of CPU per call more than this one
# (docs/decisions/104-what-the-python-template-holds.md). asyncio is preloaded by a second template,
# for code that names it or says `async` (the host picks, runner.needs_asyncio): importing it per
# call costs 21-33 ms, and in every child it made forks dearer for the tools that never use it
# (docs/decisions/104-what-the-python-template-holds.md).
PRELOAD = ("datetime", "inspect", "json", "math", "re", "traceback")
ASYNC_PRELOAD = (*PRELOAD, "asyncio")
# The finders below are plain classes (``sys.meta_path`` asks only for ``find_spec``):
# ``importlib.abc``, their base class before, imports ``importlib.resources``, so tempfile,
# shutil, zlib, bz2 and lzma with their libraries: 25 of the template's 184 mappings and 1.4
# MB of its anonymous memory, copied by every fork and torn down by every exit, for modules
# no preload asked for (docs/decisions/104-what-the-python-template-holds.md). A tool that imports
# them still can.


class _NoSsl:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in ("ssl", "_ssl"):
            raise ModuleNotFoundError(f"{name} is not preloaded", name=name)


@contextlib.contextmanager
def without_ssl() -> Iterator[None]:
    """Imports without ``ssl``: asyncio takes it if it can (and copes without it). With it,
    OpenSSL's libraries made the Python template 194 mappings and 14.4 MB of anonymous
    memory instead of 179 and 12.4 MB, whose page tables every fork copies and every exit
    tears down (docs/decisions/104-what-the-python-template-holds.md). A sandbox has no network to
    speak TLS over; a tool that imports ``ssl`` itself still gets it, as any module not preloaded
    (asyncio's own TLS support stays off in a child: it has no network to use it on)."""
    finder = _NoSsl()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def preload(names: list[str] | tuple[str, ...]) -> None:
    """Import in the template what most tools use, so children start with it for free."""
    import importlib

    with without_ssl():
        for name in names:
            importlib.import_module(name)


class CappedText(io.TextIOBase):
    """stdout/stderr replacement that keeps the first ``cap`` bytes and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError("write() argument must be str")
        n = len(s.encode("utf-8", "replace"))
        room = self.cap - self.size
        if room > 0:
            piece = s.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
            self.parts.append(piece)
            self.size += len(piece.encode())
            self.dropped += n - len(piece.encode())
        else:
            self.dropped += n
        return len(s)

    def text(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[truncated: {self.dropped} more bytes]"
        return out


class PackageFinder:
    """Last on sys.meta_path: explains refused imports. It reports nothing to the host: the
    host alone decides, from the code, what to install (sandbox/packages.py)."""

    def __init__(self, curated: dict) -> None:
        self.curated = curated

    def find_spec(self, name, path=None, target=None):
        if path is not None:
            return None  # a submodule: its package's own finder reports what is missing
        top = name
        if top in self.curated:
            raise ModuleNotFoundError(
                f"No module named '{top}': it is listed, but Toolkiln installs a listed "
                f"package when it sees it imported by name in the code (import {top}, or "
                f"importlib.import_module('{top}')), and this import was computed.",
                name=name,
            )
        listed = ", ".join(sorted(self.curated))
        raise ModuleNotFoundError(
            f"No module named '{top}'. Tools can import the standard library and: {listed}.",
            name=name,
        )


class ToolkilnLinkError(Exception):
    """The link to the platform is broken: the one failure of ``ctx`` that raises
    (docs/ctx.md). Tool code can catch it as ``ctx.LinkError``."""


class _Link:
    """The jail's end of one run's channel: ctx calls and audit rows, tagged with the run."""

    def __init__(self, sock: socket.socket, max_reply: int) -> None:
        self.sock = sock
        self.reader = protocol.Reader(sock)
        self.max_reply = max_reply
        self.next_id = 0
        self.run = None  # the host's id for this run, from its run frame

    def call(self, tool: str, payload: object) -> object:
        self.next_id += 1
        frame = {"op": protocol.CALL, "run": self.run, "id": self.next_id, "tool": tool}
        try:
            protocol.send(self.sock, {**frame, "input": payload})
            reply = self.reader.recv(self.max_reply)
        except (OSError, protocol.FrameError, TypeError, ValueError) as exc:
            raise ToolkilnLinkError(f"ctx.tools.{tool}: the platform link failed: {exc}") from None
        if (
            not isinstance(reply, dict)
            or reply.get("op") != protocol.REPLY
            or reply.get("run") != self.run
            or reply.get("id") != self.next_id
        ):
            raise ToolkilnLinkError("ctx: the platform sent an unexpected reply")
        return reply.get("result")

    def audit(self, event: object, data: object) -> None:
        frame = {"op": protocol.AUDIT, "run": self.run, "event": event, "data": data}
        try:
            protocol.send(self.sock, frame)
        except (OSError, TypeError, ValueError) as exc:
            raise ToolkilnLinkError(f"ctx.audit: {exc}") from None


class _Tools:
    def __init__(self, link: _Link, is_async: bool) -> None:
        self._link = link
        self._async = is_async

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str):
        link, is_async = self._link, self._async

        def call(payload: object = None, /, **kwargs: object) -> object:
            data = payload if payload is not None else kwargs
            if not is_async:
                return link.call(name, data)

            async def later() -> object:
                return link.call(name, data)

            return later()

        call.__name__ = name
        return call


class Ctx:
    """What a tool receives as ``ctx`` (docs/ctx.md)."""

    LinkError = ToolkilnLinkError

    def __init__(self, info: dict, link: _Link, is_async: bool) -> None:
        self.agentId = self.agent_id = info.get("agentId")
        self.agentName = self.agent_name = info.get("agentName")
        self.powerUserId = self.power_user_id = info.get("powerUserId")
        self.toolCallId = self.tool_call_id = info.get("toolCallId")
        self.conversationId = self.conversation_id = info.get("conversationId")
        self.tools = _Tools(link, is_async)
        self._link = link

    def audit(self, event: str, data: object = None) -> None:
        self._link.audit(event, data)


def _tool_line(tb) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TOOL_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)[:2000]
    except BaseException:
        return "<unprintable exception>"


def _takes_ctx(fn) -> bool:
    """Whether ``main`` declares ``ctx`` keyword-only. A plain function says so in its code
    object; inspect.signature (for anything else: wrapped, partial, a class) is pages of
    Python that every child would run twice, in the warm-up and in the call."""
    if type(fn) is FunctionType and not fn.__dict__:
        code = fn.__code__
        return (
            "ctx" in code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        )
    params = inspect.signature(fn).parameters
    return "ctx" in params and params["ctx"].kind == inspect.Parameter.KEYWORD_ONLY


def _call(fn, entry: str, data: dict, ctx: Ctx):
    if entry == "handle":
        return fn(data, ctx)
    return fn(**data, ctx=ctx) if _takes_ctx(fn) else fn(**data)


def _code(req: dict) -> CodeType:
    """The tool's code object: the one the host sent already compiled (made from this very
    source by a child that was given nothing but the source: sandbox/compiled.py), else compiled
    here. Bytes that do not load as a code object of the tool are ignored."""
    made = req.get("compiled")
    if isinstance(made, str):
        try:
            code = marshal.loads(base64.b64decode(made))  # noqa: S302 - the host made it (above)
        except Exception:  # any bytes that do not load: the source is compiled instead
            code = None
        if type(code) is CodeType and code.co_filename == TOOL_FILE:
            return code
    return compile(req["code"], TOOL_FILE, "exec")


def _compile_only(req: dict) -> dict:
    """The source compiled, as marshal bytes in base64: what later calls of this code load
    instead of compiling it. No tool byte runs here, and the request holds nothing but it.
    Code the compiler warns about (a SyntaxWarning) is not kept: a call that compiles it
    shows the warning on its stderr, and one that loaded it would not."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = compile(req["code"], TOOL_FILE, "exec")
    except BaseException as exc:
        return _exception(exc)
    if caught:
        return {"kind": "return", "value": None}  # nothing to keep: compiled per call
    return {"kind": "return", "value": base64.b64encode(marshal.dumps(code)).decode("ascii")}


def _execute(req: dict, link: _Link, finder: PackageFinder) -> dict:
    namespace = {"__name__": "__tool__", "__builtins__": __builtins__}
    try:
        code = _code(req)
        exec(code, namespace)  # noqa: S102 - this process is the sandbox
    except BaseException as exc:
        return _exception(exc)
    fn = namespace.get(req["entry"])
    if not callable(fn):
        return {
            "kind": "exception",
            "type": "NameError",
            "message": f"{req['entry']} is not defined",
        }
    is_async = inspect.iscoroutinefunction(fn)
    ctx = Ctx(req.get("context") or {}, link, is_async)
    try:
        value = _call(fn, req["entry"], req.get("input") or {}, ctx)
        if type(value) not in PLAIN and inspect.isawaitable(value):
            value = _wait_for(value)
        return {"kind": "return", "value": value}
    except BaseException as exc:
        return _exception(exc)


# An asyncio.Runner made while the child waits for its request (``_prepare_loop``), in the
# template for code that says async only; None elsewhere.
_RUNNER: Any = None


def _prepare_loop() -> None:
    """Make the event loop an async tool's call will run on before the request comes: a new
    loop in a fresh fork was ~0.9 ms of the ~1.6 ms ``asyncio.run`` took on a call's path
    (docs/decisions/104-what-the-python-template-holds.md). The loop, its epoll descriptor and its
    self-pipe are this child's own, made after the fork, and the child serves one call: nothing is
    shared with any other call. Only where asyncio is preloaded (any other child would import it). A
    warm-up run on it as well cost more CPU than it saved. The loop is not made
    the current one until the call runs on it, as ``asyncio.run`` does: what the tool's
    module does to ``asyncio.get_event_loop()`` is done to a loop of its own. If it cannot
    be made here, the call makes it (``asyncio.run``)."""
    global _RUNNER
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return
    try:
        runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        runner.get_loop()  # made now
    except Exception:  # e.g. out of descriptors: the call makes its loop itself
        return
    _RUNNER = runner


def _wait_for(value: Any) -> object:
    """``asyncio.run`` of an awaitable, on the loop made ahead when there is one: a task of
    its own in a copy of the current context (as ``asyncio.run`` makes it), then the
    runner closed as ``asyncio.run`` closes it (remaining tasks cancelled, async generators
    and the default executor shut down)."""

    async def wait() -> object:
        return await value

    import asyncio
    import contextvars  # asyncio's own import: in sys.modules already

    runner = _RUNNER
    if runner is None:
        return asyncio.run(wait())
    asyncio.set_event_loop(runner.get_loop())  # current while it runs, as in asyncio.run
    try:
        return runner.run(wait(), context=contextvars.copy_context())
    finally:
        try:
            runner.close()
        finally:
            asyncio.set_event_loop(None)


def _exception(exc: BaseException) -> dict:
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    return {
        "kind": "exception",
        "type": type(exc).__name__,
        "message": _safe_str(exc),
        "line": line if line is not None else _tool_line(exc.__traceback__),
    }


_SAMPLE = {"code": "def main(**p):\n    return {'message': str(p)}\n", "entry": "main", "input": {}}
_SAMPLE_COMPILED = {**_SAMPLE, "compiled": _compile_only(_SAMPLE)["value"]}  # in the template


# The warm-up's request as a frame's body, decoded as the host's would be.
_WARM_UP = protocol.encode({**_SAMPLE_COMPILED, "op": protocol.RUN, "run": None, "context": {}})[
    protocol.HEADER.size :
]


def _warm_up(link: _Link, finder: PackageFinder) -> None:
    """Run a trivial tool of our own before the request, so the page faults of a fresh fork
    (copy-on-write of everything the interpreter touches) are paid while idle, not per call:
    its request decoded, run and its result frame made as a call's are. It takes the path of
    compiled code (compiled.py), the one most calls take: warming the compiler as well cost
    every child ~0.1-0.4 ms of CPU (docs/decisions/106-compiled-code-per-workspace.md) and helped
    only the first two calls of a code. Decoding and the frame too moved half of the faults a call
    still took (~60) to here, with no more in all
    (docs/decisions/100-warm-children-from-a-template.md)."""
    report = _execute(protocol.decode(_WARM_UP)[0], link, finder)
    report.update(op=protocol.RESULT, run=None, stdout="", stderr="")
    result_frame(report, None, sys.maxsize)


def jail_paths(cfg: JailConfig) -> None:
    """Tool code imports from the standard library and /pkgs only. The template sets this
    once before it forks: a child that cleared the finder cache itself paid ~100
    copy-on-write page faults freeing it (docs/decisions/101-fewer-pages-written-per-child.md); a
    child only re-checks."""
    wanted = [*cfg.stdlib_paths, "/pkgs"]
    if sys.path != wanted:
        sys.path[:] = wanted
        sys.path_importer_cache.clear()


def serve(sock: socket.socket, cfg: JailConfig) -> None:
    """Prepare, wait for the one request of this child's life, run it, report, exit."""
    out, err = CappedText(cfg.max_log_bytes), CappedText(cfg.max_log_bytes)
    finder = PackageFinder(cfg.curated)
    jail_paths(cfg)
    sys.meta_path.append(finder)
    link = _Link(sock, cfg.max_reply_bytes)
    if cfg.warm_up:
        _warm_up(link, finder)
        _prepare_loop()
    sock.sendall(_answer(link, out, err, finder, cfg))
    sock.shutdown(socket.SHUT_WR)
    os._exit(0)


def _answer(
    link: _Link, out: CappedText, err: CappedText, finder: PackageFinder, cfg: JailConfig
) -> bytes:
    """The request read from ``link``, run, and its result frame."""
    req = link.reader.recv(cfg.max_request_bytes)
    link.run = req.get("run")
    sys.stdout, sys.stderr = out, err
    try:
        report = _compile_only(req) if req.get("compile_only") else _execute(req, link, finder)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    report.update(
        op=protocol.RESULT,
        run=link.run,
        stdout=out.text(),
        stderr=err.text(),
    )
    return result_frame(report, link.run, cfg.max_result_bytes)


# CPython 3.11 quickens a code object once it has started (or jumped back in a loop) 8
# times, then specialises its instructions as they run: both write into the code object.
# Short of that in the template, every child did that work on the runner's code again, a
# copy-on-write fault per page written (docs/decisions/103-template-rehearses-the-call-path.md): 10,
# 30, 100 and 300 rehearsals measured alike (a single one, tried in an earlier session, changed
# nothing).
REHEARSALS = 30
REHEARSAL_WAIT_S = 5.0  # a socket of the rehearsal's own: never a hang at start-up


def rehearse(cfg: JailConfig, times: int = REHEARSALS) -> None:
    """Run a child's whole path (the warm-up, a request read from a socket, the sample tool
    run, its result frame) in the template, before it forks: the interpreter's first-run
    work on the runner's code (quickening, specialising, the method cache) is then done
    once, in pages every child shares, not in each child. Where asyncio is preloaded, an
    ``async def`` sample too, on a loop made as a child makes it (``_prepare_loop``): its
    loop is closed by the run, and asyncio's policy is put back as it was (none) at the
    end, so a tool's module still finds no current loop and ``asyncio.get_event_loop()``
    makes one of its own. Our own samples only: nothing of any call is in the template, and
    each rehearsal's socket pair is closed. What a tool can tell: the same for every call
    and carrying nothing of any (asyncio's task names count on from the rehearsal's, e.g.
    a tool's first task is ``Task-91``, not ``Task-1``). Raises if a sample did not return
    (the template then goes on without it: template.py)."""
    global _RUNNER
    samples = [_SAMPLE_COMPILED]
    asyncio = sys.modules.get("asyncio")
    policy = asyncio.events._event_loop_policy if asyncio is not None else None
    if asyncio is not None:
        samples.append({**_ASYNC_SAMPLE, "compiled": _compile_only(_ASYNC_SAMPLE)["value"]})
    run = {"op": protocol.RUN, "run": "rehearsal", "timeout_ms": 1000, "context": {}}
    frames = [protocol.encode({**sample, **run}) for sample in samples]
    finder = PackageFinder(cfg.curated)
    try:
        for _ in range(times):
            for frame in frames:
                mine, host = socket.socketpair()
                with mine, host:
                    mine.settimeout(REHEARSAL_WAIT_S)
                    host.settimeout(REHEARSAL_WAIT_S)
                    host.sendall(frame)
                    link = _Link(mine, cfg.max_reply_bytes)
                    out = CappedText(cfg.max_log_bytes)
                    err = CappedText(cfg.max_log_bytes)
                    _warm_up(link, finder)
                    if frame is not frames[0]:
                        _prepare_loop()
                    try:
                        mine.sendall(_answer(link, out, err, finder, cfg))
                    finally:
                        _RUNNER = None  # closed by the run; each child makes its own
                    report = protocol.Reader(host).recv(cfg.max_result_bytes)
                    if report.get("kind") != "return":
                        raise RuntimeError(f"a rehearsal's sample did not return: {report}")
    finally:
        if asyncio is not None:
            asyncio.set_event_loop_policy(policy)  # as before the first loop was set


_ASYNC_SAMPLE = {
    "code": "async def main(**p):\n    return {'message': str(p)}\n",
    "entry": "main",
    "input": {},
}


def result_frame(report: dict, run: object, max_bytes: int) -> bytes:
    """The encoded result, or the report of why it cannot be sent (shared with jsrunner)."""
    head = {"op": protocol.RESULT, "run": run}
    logs = {"stdout": report.get("stdout", ""), "stderr": report.get("stderr", "")}
    try:
        data = protocol.encode(report)
    except (TypeError, ValueError, RecursionError) as exc:
        message = f"{_safe_str(exc)[:300]}."
        data = protocol.encode({**head, "kind": "unserializable", "message": message, **logs})
    if len(data) > max_bytes:
        short = {k: v[:1000] for k, v in logs.items()}
        data = protocol.encode({**head, "kind": "too_large", "size": len(data), **short})
    return data
