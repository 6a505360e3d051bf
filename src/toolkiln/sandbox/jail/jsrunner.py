"""Runs JavaScript tool calls in a long-lived jailed worker, a fresh V8 context each.

V8 cannot be forked once started, and starting it costs ~40-60 ms, so a JavaScript worker
lives for several calls (the host recycles it after a few dozen, and kills it on any
timeout or crash). Each call gets a new V8 isolate and context: no global, prototype or
pending promise reaches the next call. The engine is a convenience; the jail around the
worker (namespaces, read-only root, uid, seccomp, cgroup) is the boundary.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket

import protocol
from pyrunner import result_frame

PRELUDE = r"""
(() => {
  const logs = { out: [], err: [], size: 0, dropped: 0 };
  const cap = __TK_LOG_CAP__;
  const fmt = (a) => a.map((x) => {
    if (typeof x === 'string') return x;
    try { return JSON.stringify(x); } catch (e) { return String(x); }
  }).join(' ');
  const push = (stream) => (...a) => {
    const line = fmt(a) + '\n';
    if (logs.size + line.length > cap) { logs.dropped += line.length; return; }
    logs.size += line.length;
    logs[stream].push(line);
  };
  const c = { log: push('out'), info: push('out'), debug: push('out'),
              warn: push('err'), error: push('err'), trace: push('err') };
  Object.defineProperty(globalThis, 'console',
                        { value: Object.freeze(c), writable: false, configurable: false });
  const stringify = JSON.stringify, parse = JSON.parse;  // captured before any tool code
  Object.defineProperty(globalThis, '__tk_logs', { value: () => stringify(logs) });
  Object.defineProperty(globalThis, '__tk_parse', { value: (s) => parse(s) });
  const wf = (s) => String(s).toWellFormed();
  Object.defineProperty(globalThis, '__tk_wellformed', { value: (e) => {
    if (typeof e === 'string') return wf(e);
    if (e === null || (typeof e !== 'object' && typeof e !== 'function')) return e;
    try {
      const name = String(e.name), message = String(e.message), stack = String(e.stack);
      if (name.isWellFormed() && message.isWellFormed() && stack.isWellFormed()) return e;
      const copy = new Error(wf(message));
      copy.name = wf(name);
      copy.stack = wf(stack);
      return copy;
    } catch (x) {
      return new Error('the thrown value cannot be read');
    }
  } });
  // A value JSON cannot spell (a BigInt, a cycle, a throwing toJSON) is the code's result
  // error, not a runtime error: it is reported with a prefix no JSON text starts with.
  Object.defineProperty(globalThis, '__tk_finish', { value: (v) => {
    try { return stringify(v === undefined ? null : v); }
    catch (e) { return '!' + String(e && e.message).slice(0, 300); }
  } });
  for (const name of ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval',
                      'SharedArrayBuffer', 'Atomics', 'WebAssembly', '__TimerManager']) {
    try { delete globalThis[name]; } catch (e) {}
    if (name in globalThis) { try { globalThis[name] = undefined; } catch (e) {} }
  }
})();
"""

# Strings cross from V8 to Python only as JSON text made by the JSON.stringify captured
# here (it escapes lone surrogates, which the engine's own string conversion cannot pass).
INSTALL_CTX = """(host, info) => {
  const stringify = JSON.stringify, parse = JSON.parse;
  const encode = (input) => stringify(input === undefined ? null : input);
  const call = (name, input) => host(stringify(String(name)), encode(input)).then((r) => parse(r));
  const tools = new Proxy({}, {
    get: (_, name) => (typeof name === 'string' ? (input) => call(name, input) : undefined),
  });
  const meta = parse(info);
  const audit = (event, data) =>
    call('__audit__', [event, data === undefined ? null : data]).then(() => undefined);
  const ctx = Object.freeze({ ...meta, tools, audit });
  Object.defineProperty(globalThis, '__tk_ctx', { value: ctx });
}"""

LOADER = """(sourcesJson, listedJson) => {
  const sources = JSON.parse(sourcesJson), listed = JSON.parse(listedJson), cache = {};
  const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
  const require = (name) => {
    if (has(cache, name)) return cache[name];
    if (!has(sources, name)) {
      throw new Error(`Cannot find module '${name}'. Tools can require: ${listed.join(', ')}`);
    }
    const module = { exports: {} };
    (new Function('module', 'exports', 'require', sources[name]))(module, module.exports, require);
    cache[name] = module.exports;
    return module.exports;
  };
  Object.defineProperty(globalThis, 'require', { value: require });
  Object.defineProperty(globalThis, '__tk_default',
                        { value: (m) => (m && m.__esModule && 'default' in m ? m.default : m) });
}"""

# What the code throws is made well-formed text before the engine converts it for Python
# (a lone surrogate in an error's name or message would break that conversion).
RUNNER = """async (input) => {
  try { return __tk_finish(await __ENTRY__(__tk_parse(input), __tk_ctx)); }
  catch (e) { throw __tk_wellformed(e); }
}"""


def preload(mr_module: object) -> None:
    """Start V8 and warm libffi's closure pool before seccomp forbids executable memory."""

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


def _error(exc: BaseException) -> dict:
    text = str(exc)
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
    return {
        "kind": "exception",
        "type": (kind if message else name)[:100],
        "message": (message or first)[:2000],
        "line": line,
        "column": column,
    }


LOG_CAP = 65536


class Fresh:
    """An isolate made while the worker is idle, after the previous call's report was sent:
    a new V8 isolate and context with the prelude evaluated and the ctx installer and module
    loader compiled. It serves at most one call and is closed when that call ends."""

    def __init__(self, mr_module: object, heap_bytes: int, log_cap: int = LOG_CAP) -> None:
        self.log_cap = log_cap
        self.mr = mr_module.MiniRacer()  # type: ignore[attr-defined]
        try:
            self.mr.set_hard_memory_limit(heap_bytes)
            self.mr.eval(PRELUDE.replace("__TK_LOG_CAP__", str(int(log_cap))))
            self.install_ctx = self.mr.eval(INSTALL_CTX)
            self.loader = self.mr.eval(LOADER)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        # JS handles first: they are freed against their context.
        self.install_ctx = self.loader = None
        self.mr.close()


async def _run(fresh: Fresh, req: dict, link) -> dict:
    mr = fresh.mr
    calls = {"n": 0}

    async def host(*args: object) -> str:
        name, payload = json.loads(str(args[0])), json.loads(str(args[1]))
        if name == "__audit__":
            event, data = (
                payload if isinstance(payload, list) and len(payload) == 2 else (None, None)
            )
            link.audit(event, data)
            return "null"
        calls["n"] += 1
        return json.dumps(link.call(name, payload))

    async with mr.wrap_py_function(host) as js_host:
        fresh.install_ctx(js_host, json.dumps(req.get("context") or {}))
        sources = {}
        for name, path in (req.get("modules") or {}).items():
            with open(path, encoding="utf-8") as f:  # under /pkgs, read-only
                sources[name] = f.read()
        fresh.loader(json.dumps(sources), json.dumps(req.get("listed") or []))
        try:
            mr.eval(req["code"])
        except Exception as exc:
            return {**_error(exc), "phase": "load"}
        runner = mr.eval(RUNNER.replace("__ENTRY__", req["entry"]))
        try:
            value = await runner(json.dumps(req.get("input") or {}))
        except Exception as exc:
            if mr.was_hard_memory_limit_reached():
                return {
                    "kind": "exception",
                    "type": "MemoryError",
                    "message": "JavaScript heap limit reached",
                }
            return _error(exc)
        if value.startswith("!"):
            return {
                "kind": "unserializable",
                "message": f"{value[1:]}.",
            }
        return {"kind": "return", "value": json.loads(value)}


async def _prepare(mr_module: object, heap: int, log_cap: int = LOG_CAP) -> Fresh | None:
    # Made inside a coroutine: an isolate binds to the running loop (the worker's own).
    try:
        return Fresh(mr_module, heap, log_cap)
    except Exception:
        return None  # made again, and its error reported, when a call needs it


async def _one(box: list, mr_module: object, req: dict, link, heap: int) -> tuple[dict, dict]:
    """One call in its own isolate: ``box[0]``, prepared, or one made now and put there
    (whoever holds the box closes it once the report is sent)."""
    try:
        log_cap = int(req.get("log_cap", LOG_CAP))
        if box[0] is None or box[0].log_cap != log_cap:
            if box[0] is not None:
                box[0].close()
            box[0] = None
            box[0] = Fresh(mr_module, heap, log_cap)
        report = await _run(box[0], req, link)
        logs = json.loads(box[0].mr.eval("__tk_logs()"))
    except Exception as exc:
        report, logs = _error(exc), {"out": [], "err": [], "dropped": 0}
    return report, logs


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on the way out: nothing a call started outlives it."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


def serve(sock: socket.socket, cfg: dict, mr_module: object, link_factory) -> None:
    """Serve calls until the host closes the control channel (or kills us).

    The control channel only ever carries one byte per call with the call's own channel
    attached (SCM_RIGHTS); the call's request, ctx frames and result travel on that channel,
    which is closed when the call ends, so no byte of one call can be read by the next."""
    heap = int(cfg.get("js_heap_mb", 128)) * 1024 * 1024
    loop = asyncio.new_event_loop()
    fresh = loop.run_until_complete(_prepare(mr_module, heap))
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1, 1)
        except OSError:
            return
        if not msg or len(fds) != 1:
            return  # not the host's way of starting a call: stop serving
        chan = socket.socket(fileno=fds[0])
        link = link_factory(chan, int(cfg["max_reply_bytes"]))
        try:
            _serve_call(chan, cfg, mr_module, link, heap, loop, fresh)
        except (OSError, protocol.FrameError):
            pass  # the host gave up on this call (and will retire us if it must)
        finally:
            chan.close()
        # Off the call's path, while idle: the next call's isolate.
        fresh = loop.run_until_complete(_prepare(mr_module, heap))


def _serve_call(chan: socket.socket, cfg: dict, mr_module: object, link, heap: int, loop, fresh):
    """One call; its isolate (prepared or made now) is closed once the report is sent."""
    box = [fresh]
    try:
        _answer(chan, cfg, mr_module, link, heap, loop, box)
    finally:
        if box[0] is not None:
            box[0].close()


def _answer(chan: socket.socket, cfg: dict, mr_module: object, link, heap: int, loop, box):
    req = link.reader.recv(int(cfg["max_request_bytes"]))
    if not isinstance(req, dict) or req.get("op") != protocol.RUN:
        return
    link.run = req.get("run")
    report, logs = loop.run_until_complete(_one(box, mr_module, req, link, heap))
    _settle(loop)
    marker = f"\n[truncated: {logs['dropped']} more bytes]" if logs.get("dropped") else ""
    report.update(
        op=protocol.RESULT,
        run=link.run,
        stdout="".join(logs["out"]) + marker,
        stderr="".join(logs["err"]),
    )
    chan.sendall(result_frame(report, link.run, int(cfg["max_result_bytes"])))
