// Test cases' reports: from a refused write (422 tests_failed) or from run-tests.

import { h, pretty } from "./dom.js";

export function isCaseReport(details) {
  return Array.isArray(details) && details.every((c) => c && typeof c === "object" && "passed" in c);
}

export function caseReport(cases, summary) {
  const list = Array.isArray(cases) ? cases : [];
  const failed = list.filter((c) => !c.passed).length;
  return h(
    "div",
    { class: "cases" },
    h("p", { text: summary || `${list.length - failed} passed, ${failed} failed` }),
    h(
      "ul",
      { "aria-label": "Test case results" },
      list.map((c) => {
        const result = c.result || {};
        const mismatches = Array.isArray(c.mismatch) ? c.mismatch : [];
        return h(
          "li",
          { class: c.passed ? "case-pass" : "case-fail" },
          h("strong", { text: `${c.passed ? "passed" : "failed"}: ${String(c.name ?? "")}` }),
          mismatches.length
            ? h(
                "ul",
                {},
                mismatches.map((m) =>
                  h("li", { text: `${String(m.field)}: expected ${pretty(m.expected)}, got ${pretty(m.actual)}` }),
                ),
              )
            : null,
          !c.passed && result.error
            ? h("p", { text: `${String(result.error.code)}: ${String(result.error.message ?? "")}` })
            : null,
        );
      }),
    ),
  );
}
