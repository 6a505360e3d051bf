// One per entry point, so an error names it as the code wrote it ("main is not defined").
// What the code throws is made well-formed text before the engine converts it for Python
// (a lone surrogate in an error's name or message would break that conversion).
// __ENTRY__ is replaced by the entry point's name.
(begin, settle) => (input, info) => {
  const ctx = begin(info);
  let v;
  try { v = __ENTRY__(__tk_parse(input), ctx); return settle(v); }
  catch (e) { return __tk_reject(e); }
}
