// Made while the worker is idle, with the isolate (``Fresh``): everything of a call that does
// not depend on its code or input, so a call returning at once crosses from Python to V8
// three times (its code, its entry, its report; one more to take the ctx queue if the entry
// returns a promise, and one per ctx call to answer it). Strings cross from V8 to Python
// only as JSON text made by the JSON.stringify captured here (it escapes lone surrogates,
// which the engine's own string conversion cannot pass).
(listedJson, entries) => {
  const stringify = JSON.stringify, parse = JSON.parse, freeze = Object.freeze;
  let issued = 0;  // ctx calls this call made
  // A ctx call is queued with a promise of its answer; the worker takes the queue after the
  // call's entry and after each answer (__tk_take), makes the calls and answers each
  // (__tk_answer), until none is left: no host callback is wrapped into the isolate
  // (docs/decisions/115-javascript-ctx-queue.md).
  const queue = [], waiting = new Map();
  let last = 0;
  const encode = (input) => stringify(input === undefined ? null : input);
  const call = (name, input) => {
    issued += 1;
    const request = [last + 1, stringify(String(name)), encode(input)];  // may throw: now
    if (request[2] === undefined) {  // a function, a symbol: nothing JSON can spell
      return Promise.reject(new TypeError('a ctx call takes what JSON can spell'));
    }
    last += 1;
    queue.push(request);
    return new Promise((ok, no) => { waiting.set(last, [ok, no]); }).then((r) => parse(r));
  };
  // Any name is a tool, but for those the language itself asks an object for: 'then' (so
  // awaiting ctx.tools does not call a tool named then, and hang), 'toJSON'
  // (JSON.stringify(ctx)), 'toString' and 'valueOf' (String(ctx.tools)), and the like.
  const notTools = new Set(['then', 'toJSON', 'toString', 'valueOf', 'constructor', 'inspect']);
  const tools = new Proxy({}, {
    get: (_, name) => (typeof name === 'string' && !notTools.has(name)
      ? (input) => call(name, input) : undefined),
  });
  const audit = (event, data) =>
    call('__audit__', [event, data === undefined ? null : data]).then(() => undefined);
  const listed = parse(listedJson), cache = {};
  let sources = {};
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
  const define = (name, value) => Object.defineProperty(globalThis, name, { value });
  // At most 64 calls, or what passes 1 MiB of text, taken at once.
  define('__tk_take', () => {
    let n = 0, size = 0;
    while (n < queue.length && n < 64 && (n === 0 || size + queue[n][2].length <= 1048576)) {
      size += queue[n][2].length;
      n += 1;
    }
    return stringify(queue.splice(0, n));
  });
  define('__tk_answer', (id, ok, text) => {
    const pair = waiting.get(id);
    if (pair === undefined) return;
    waiting.delete(id);
    if (ok) pair[0](text); else pair[1](new Error(text));
  });
  define('require', require);
  define('__tk_default', (m) => (m && m.__esModule && 'default' in m ? m.default : m));
  define('__tk_modules', (s) => { sources = parse(s); });
  // A value returned at once (no promise, no ctx call in flight) is kept for __tk_report,
  // read once the microtasks the call queued have run (as after an await); anything else
  // is a promise: the text it resolved to is kept too (__tk_done), read once the worker
  // has answered the ctx calls; one rejected, or still waiting, is awaited by the worker.
  let done = false, kept, outcome = null;  // done: a value was returned at once
  const begin = (info) => {
    issued = 0; outcome = null;
    return freeze({ ...parse(info), tools, audit });
  };
  const settle = (v) => {
    if (issued === 0 && !(v !== null && (typeof v === 'object' || typeof v === 'function')
                          && 'then' in v)) {
      done = true; kept = v; return null;
    }
    const settled = (async () => {
      try { return __tk_finish(await v); } catch (e) { throw __tk_wellformed(e); }
    })();
    settled.then((text) => { outcome = text; }, () => {});
    return settled;
  };
  // For a promise: the ctx calls waiting to be taken, the logs, the text it resolved to
  // ('' while it has not): one read.
  define('__tk_done', () => `${queue.length}\n${__tk_logs()}\n${outcome ?? ''}`);
  for (const [name, make] of Object.entries(entries)) define(name, make(begin, settle));
  // The ctx calls issued since (by the microtasks), the logs, the value: one read.
  define('__tk_report', () => `${issued}\n${__tk_logs()}\n${done ? __tk_finish(kept) : 'null'}`);
  // V8 compiles a function when it first runs: run a call's own path once now, while the
  // worker is idle, with an entry of ours defined for it alone (no tool code is here yet).
  // Nothing of it is kept: the entry is deleted, a call begins afresh, the report resets.
  for (const name of Object.keys(entries)) {
    const entry = name.slice('__tk_run_'.length);
    globalThis[entry] = () => null;
    globalThis[name]('{}', '{}');
    delete globalThis[entry];
  }
  __tk_report();
  done = false; kept = undefined;
}
