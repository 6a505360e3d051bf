"""Malicious JavaScript tools: published vm/vm2 escapes, engine tricks and resource abuse.
Each must end in a contained, correctly classified Result, with the service healthy. V8 is a
convenience here; the jail around its worker is the boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.security.conftest import SECRET, Target

ESCAPED = "no process here"
RUNTIME = {"runtime_error"}


def returns(value: Any):
    return lambda r: r["status"] == "ok" and r["raw_data"] == value


ATTACKS: list[tuple[str, str, Any]] = [
    # --- the classic vm / vm2 escapes: reach Node's process from the sandbox
    (
        "constructor-constructor",
        "function handle() { return typeof this.constructor.constructor('return process')() }",
        RUNTIME | {"invalid_result"},
    ),
    (
        "function-constructor-process",
        "function handle() { return Function('return typeof process')() }",
        returns("undefined"),
    ),
    (
        "arguments-callee-caller",
        "async function handle() { try { return await arguments.callee.caller.constructor('return typeof process')() } catch (e) { return 'blocked' } }",
        lambda r: r["raw_data"] in ("undefined", "blocked"),
    ),
    (
        "prepare-stack-trace",
        "function handle() { Error.prepareStackTrace = (e, frames) => frames.map(f => typeof f.getThis()); const s = new Error().stack; return typeof s === 'string' || Array.isArray(s) ? 'contained' : s }",
        returns("contained"),
    ),
    (
        "proxy-get-trap-escape",
        "function handle() { const p = new Proxy({}, { get: (t, k) => (k === 'constructor' ? Function : undefined) }); return typeof p.constructor('return this')().process }",
        returns("undefined"),
    ),
    (
        "symbol-for-inspect",
        "function handle() { const s = Symbol.for('nodejs.util.inspect.custom'); const o = { [s]: () => 1 }; return typeof globalThis.process }",
        returns("undefined"),
    ),
    (
        "vm2-cve-2023-29017-async-error",
        "async function handle() { const e = new Error(); e.name = Symbol(); try { await Promise.reject(e) } catch (x) { return typeof x.constructor.constructor('return process')() } }",
        lambda r: (
            (r["error"] or {}).get("code") == "runtime_error"
            and "process is not defined" in r["error"]["message"]
        ),
    ),
    (
        "vm2-cve-2023-30547-handler",
        "function handle() { try { const err = new Proxy({}, { getPrototypeOf: () => { throw 1 } }); throw err } catch (e) { return typeof globalThis.process } }",
        returns("undefined"),
    ),
    (
        "vm2-cve-2023-32314-proxy",
        "function handle() { const h = { getPrototypeOf(t) { return (function(){}).constructor('return process')() } }; try { Object.getPrototypeOf(new Proxy({}, h)); return 'x' } catch (e) { return e.name } }",
        returns("ReferenceError"),
    ),
    (
        "vm2-cve-2023-37466-promise",
        "async function handle() { const p = Promise.resolve(); p.constructor = function(f) { f(() => {}, () => {}) }; return typeof (await import('node:process').catch(() => undefined)) }",
        returns("undefined"),
    ),
    (
        "vm2-2026-style-species",
        "function handle() { class X extends Array { static get [Symbol.species]() { return function() { return typeof process } } } return new X(1).map(x => x).length }",
        RUNTIME | {"invalid_result", "sandbox_violation"} | {"ok"},
    ),
    # --- Node and Deno APIs must not exist
    (
        "require-fs",
        "function handle() { return require('fs').readFileSync('/etc/passwd', 'utf8') }",
        RUNTIME,
    ),
    ("process-env", "function handle() { return process.env }", RUNTIME),
    (
        "dynamic-import",
        "async function handle() { const m = await import('fs'); return Object.keys(m) }",
        RUNTIME,
    ),
    (
        "fetch",
        "async function handle() { return await fetch('http://127.0.0.1:8080/healthz') }",
        RUNTIME,
    ),
    ("buffer", "function handle() { return Buffer.from('x').toString('hex') }", RUNTIME),
    ("set-timeout", "function handle() { return setTimeout(() => 1, 1) }", RUNTIME),
    ("deno", "function handle() { return Deno.readTextFileSync('/etc/passwd') }", RUNTIME),
    (
        "globals-are-bare",
        "function handle() { return ['process','Buffer','fetch','setTimeout','SharedArrayBuffer','Atomics','WebAssembly','Deno'].filter(n => typeof globalThis[n] !== 'undefined') }",
        returns([]),
    ),
    (
        "shared-array-buffer",
        "function handle() { return new SharedArrayBuffer(8).byteLength }",
        RUNTIME,
    ),
    (
        "atomics-wait",
        "function handle() { return Atomics.wait(new Int32Array(4), 0, 0, 10000) }",
        RUNTIME,
    ),
    (
        "webassembly",
        "async function handle() { return typeof (await WebAssembly.instantiate(new Uint8Array([0,97,115,109,1,0,0,0]))) }",
        RUNTIME,
    ),
    # --- resources
    (
        "busy-loop",
        "function handle() { while (true) {} return 1 }",
        {"timeout"},
    ),
    (
        "never-resolving-promise",
        "async function handle() { await new Promise(() => {}); return 1 }",
        {"timeout"},
    ),
    (
        "promise-flood",
        "async function handle() { let p = Promise.resolve(); for (;;) { p = p.then(() => 1) } return p }",
        {"timeout", "memory_limit"},
    ),
    (
        "huge-array",
        "function handle() { const a = []; for (;;) a.push(new Array(1e6).fill(7)); return a }",
        {"memory_limit"},
    ),
    (
        "huge-string",
        "function handle() { let s = 'x'; for (;;) s += s; return s }",
        {"memory_limit", "runtime_error"},
    ),
    ("huge-result", "function handle() { return 'x'.repeat(5e6) }", {"output_too_large"}),
    (
        "console-flood",
        "function handle() { for (let i = 0; i < 200000; i++) console.log('flood flood flood'); return 'done' }",
        lambda r: (
            r["status"] == "ok"
            and len(r["logs"]["stdout"]) < 70_000
            and "[truncated" in r["logs"]["stdout"]
        ),
    ),
    ("deep-recursion", "function handle() { const f = (n) => f(n + 1) + 1; return f(0) }", RUNTIME),
    (
        "cyclic-result",
        "function handle() { const o = {}; o.o = o; return o }",
        {"invalid_result"},
    ),
    ("bigint-result", "function handle() { return 10n ** 100n }", {"invalid_result"}),
    (
        "bigint-nested-in-main",
        "function main() { return { message: 'm', rawData: { n: 1n } } }",
        {"invalid_result"},
    ),
    (
        "throwing-tojson-result",
        "function handle() { return { toJSON() { throw new Error('no') } } }",
        {"invalid_result"},
    ),
    (
        "throw-non-error",
        "function handle() { throw { toString() { throw new Error('nested') } }; return 1 }",
        RUNTIME,
    ),
    (
        "ctx-tools-flood",
        "async function handle(i, ctx) { const out = []; for (let n = 0; n < 60; n++) out.push(await ctx.tools.calculate({ expression: '1' })); return out[50] }",
        lambda r: r["status"] == "ok" and r["raw_data"]["error"] == "call_limit",
    ),
    (
        "frozen-ctx",
        "function handle(i, ctx) { try { ctx.tools = null; ctx.agentId = 'forged' } catch (e) {} return [typeof ctx.tools, ctx.agentId === 'forged'] }",
        returns(["object", False]),
    ),
    (
        "require-path-traversal",
        "function handle() { return require('../../../../etc/passwd') }",
        RUNTIME,
    ),
    (
        "require-builtin-module",
        "function handle() { try { require.cache = {} } catch (e) {} return typeof require('child_process') }",
        RUNTIME,
    ),
]


@pytest.mark.parametrize("name,code,expect", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_javascript_attack_is_contained(target: Target, name: str, code: str, expect: Any) -> None:
    # A heap filler ends at the memory cap well within 5 s; on a loaded host 1.5 s may not do.
    timeout_ms = 5000 if expect == {"memory_limit"} else 1500
    res = target.run(code, timeout_ms=timeout_ms, language="javascript")
    if callable(expect):
        assert expect(res), (name, res["error"], res["raw_data"])
    else:
        got = res["error"]["code"] if res["error"] else "ok"
        assert got in expect, (name, res["error"], res["raw_data"])
    assert SECRET not in json.dumps(res)
    target.assert_contained()


def test_no_state_survives_between_javascript_calls(target: Target) -> None:
    plant = (
        "function handle() {\n"
        "  globalThis.planted = 1;\n"
        "  Object.prototype.polluted = 'yes';\n"
        "  Array.prototype.map = () => 'hijacked';\n"
        "  JSON.parse = () => 'hijacked';\n"
        "  new Promise(() => {});\n"
        "  return 'planted';\n"
        "}\n"
    )
    assert target.run(plant, language="javascript")["raw_data"] == "planted"
    look = "function handle() { return [typeof globalThis.planted, ({}).polluted === undefined, [1].map(x => x + 1)[0], JSON.parse('1')] }"
    assert target.run(look, language="javascript")["raw_data"] == ["undefined", True, 2, 1]
