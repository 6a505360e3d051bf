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

import frames

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
  Object.defineProperty(globalThis, '__tk_finish',
                        { value: (v) => stringify(v === undefined ? null : v) });
  for (const name of ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval',
                      'SharedArrayBuffer', 'Atomics', 'WebAssembly', '__TimerManager']) {
    try { delete globalThis[name]; } catch (e) {}
    if (name in globalThis) { try { globalThis[name] = undefined; } catch (e) {} }
  }
})();
"""

INSTALL_CTX = """(host, info) => {
  const encode = (input) => JSON.stringify(input === undefined ? null : input);
  const call = (name, input) => host(String(name), encode(input)).then((r) => JSON.parse(r));
  const tools = new Proxy({}, {
    get: (_, name) => (typeof name === 'string' ? (input) => call(name, input) : undefined),
  });
  const meta = JSON.parse(info);
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

RUNNER = """async (input) => __tk_finish(await __ENTRY__(__tk_parse(input), __tk_ctx))"""


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


async def _run(mr, req: dict, link, heap_bytes: int) -> dict:
    calls = {"n": 0}

    async def host(*args: object) -> str:
        name, payload = str(args[0]), json.loads(str(args[1]))
        if name == "__audit__":
            event, data = (
                payload if isinstance(payload, list) and len(payload) == 2 else (None, None)
            )
            link.audit(event, data)
            return "null"
        calls["n"] += 1
        return json.dumps(link.call(name, payload))

    mr.set_hard_memory_limit(heap_bytes)
    async with mr.wrap_py_function(host) as js_host:
        mr.eval(PRELUDE.replace("__TK_LOG_CAP__", str(int(req.get("log_cap", 65536)))))
        mr.eval(INSTALL_CTX)(js_host, json.dumps(req.get("context") or {}))
        sources = {}
        for name, path in (req.get("modules") or {}).items():
            with open(path, encoding="utf-8") as f:  # under /pkgs, read-only
                sources[name] = f.read()
        mr.eval(LOADER)(json.dumps(sources), json.dumps(req.get("listed") or []))
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
        return {"kind": "return", "value": json.loads(value)}


async def _one(mr_module: object, req: dict, link, heap: int) -> tuple[dict, dict]:
    """One call in a fresh isolate, made and closed inside this coroutine."""
    mr = mr_module.MiniRacer()  # type: ignore[attr-defined]
    try:
        report = await _run(mr, req, link, heap)
        logs = json.loads(mr.eval("__tk_logs()"))
    except Exception as exc:
        report, logs = _error(exc), {"out": [], "err": [], "dropped": 0}
    finally:
        mr.close()
    return report, logs


def serve(sock: socket.socket, cfg: dict, mr_module: object, link_factory) -> None:
    """Answer requests until the host closes the channel (or kills us)."""
    link = link_factory(sock, int(cfg["max_reply_bytes"]))
    heap = int(cfg.get("js_heap_mb", 128)) * 1024 * 1024
    while True:
        try:
            req = link.reader.recv(int(cfg["max_request_bytes"]))
        except frames.FrameError:
            return
        report, logs = asyncio.run(_one(mr_module, req, link, heap))
        marker = f"\n[truncated: {logs['dropped']} more bytes]" if logs.get("dropped") else ""
        report.update(
            op="result", stdout="".join(logs["out"]) + marker, stderr="".join(logs["err"])
        )
        try:
            data = frames.encode(report)
        except (TypeError, ValueError, RecursionError) as exc:
            data = frames.encode(
                {"op": "result", "kind": "unserializable", "message": str(exc)[:300]}
            )
        if len(data) > int(cfg["max_result_bytes"]):
            data = frames.encode({"op": "result", "kind": "too_large", "size": len(data)})
        sock.sendall(data)
