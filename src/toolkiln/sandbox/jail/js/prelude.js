// The prelude of every call's context, evaluated before any tool code (jsrunner.py).
// __TK_LOG_CAP__ is replaced by the cap of the call's logs, in characters.
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
  // Captured before any tool code: the helpers below run in the call's isolate, after
  // the code may have replaced any global (Error, String, Promise, their prototypes).
  const NativeError = Error, NativeString = String, NativePromise = Promise;
  const apply = Reflect.apply, defineOwn = Object.defineProperty;
  const promiseReject = Promise.reject, toWellFormed = String.prototype.toWellFormed;
  const sliceString = String.prototype.slice;
  const clip = (s, n) => apply(toWellFormed, apply(sliceString, s, [0, n]), []);
  // An Error made here, whose name, message and stack are plain strings of its own: the
  // stack is what mini-racer reads (and, without one, the value's Python repr).
  const made = (name, message, stack) => {
    const e = new NativeError(message);
    defineOwn(e, 'name', { value: name, writable: true, configurable: true });
    defineOwn(e, 'stack', { value: stack ?? `${name}: ${message}`, writable: true,
                            configurable: true });
    return e;
  };
  // What the code threw, as text: its JSON if it has one, else String(e).
  const described = (e) => {
    try {
      const j = stringify(e);
      if (typeof j === 'string') return clip(j, 2000);
    } catch (x) {}
    return clip(NativeString(e), 2000);
  };
  // Whatever the code throws leaves the isolate as an Error made here, never the value
  // itself: a value that is not an Error, or an Error whose stack is not a string, reached
  // Python as mini-racer's rendering of it (a wrapper's Python repr with a heap address in
  // it, "None", "JSUndefined"), and a BigInt there left mini-racer's await unsettled
  // (tests/security/test_js_thrown_values.py). Each property is read once (a getter answers
  // once), and text is made well-formed (a lone surrogate breaks the engine's conversion).
  defineOwn(globalThis, '__tk_wellformed', { value: (e) => {
    try {
      if (typeof e === 'bigint') return made('Error', `${e}n`);
      if (e === null || (typeof e !== 'object' && typeof e !== 'function')) {
        return made('Error', clip(NativeString(e), 2000));
      }
      const message = e.message, name = e.name, stack = e.stack;
      if (typeof message !== 'string') return made('Error', described(e));
      return made(typeof name === 'string' && name ? clip(name, 100) : 'Error',
                  clip(message, 2000), typeof stack === 'string' ? clip(stack, 16384) : undefined);
    } catch (x) {
      return made('Error', 'the thrown value cannot be read');
    }
  } });
  // A rejected promise of the engine's own, whatever the code did to Promise.
  defineOwn(globalThis, '__tk_reject', {
    value: (e) => apply(promiseReject, NativePromise, [__tk_wellformed(e)]),
  });
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
