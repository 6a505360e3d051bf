// A saved tool's recent calls (its newest tool.invoked audit rows), each call's Result on
// demand from GET /v1/tool-calls/{id}.

import { api, q } from "./api.js";
import { clear, h, section, when } from "./dom.js";
import { resultView } from "./result.js";
import { cardTable, cell, row } from "./tables.js";

const SHOWN = 20;

export function callsSection(tool) {
  const table = cardTable("Recent calls of this tool", ["When", "Status", "Duration", "Source", "Result"]);
  const out = h("div", { class: "result-box", "aria-live": "polite" });

  const show = async (id) => {
    try {
      // Asked in the tool's workspace: call ids are the callers' own and unique per workspace
      // only (tests/web/test_hostile.py, a call id another workspace reused).
      const path = `/v1/tool-calls/${q(id)}?workspace_id=${q(tool.workspace_id)}`;
      clear(out, resultView((await api("GET", path)).data));
    } catch (err) {
      clear(out, h("p", { class: "form-alert", role: "alert", text: err.message }));
    }
  };

  const callRow = (r) => {
    const d = r.data && typeof r.data === "object" ? r.data : {};
    const status = String(d.status ?? "");
    // A test run's execution counts nothing and stores no Result to show.
    const test = d.test_run === true;
    return row(
      {},
      cell("When", { text: when(r.created_at) }),
      cell(
        "Status",
        {},
        h("span", { class: `status status-${status === "ok" ? "ok" : "error"}`, text: status }),
        test ? " (test run)" : "",
      ),
      cell("Duration", { class: "num", text: d.duration_ms === undefined ? "" : `${d.duration_ms} ms` }),
      cell("Source", { text: r.source || "" }),
      cell(
        "Result",
        {},
        r.tool_call_id && !test
          ? h("button", {
              type: "button",
              class: "link",
              onclick: () => show(r.tool_call_id),
              text: "Show result",
              "aria-label": `Show result of call ${r.tool_call_id}`,
            })
          : "",
      ),
    );
  };

  return {
    element: section("calls-h", "Recent calls", table.element, out),
    // rows: the tool's audit rows, newest first (auditfeed.js).
    draw(rows) {
      clear(
        table.body,
        rows
          .filter((r) => r.event === "tool.invoked")
          .slice(0, SHOWN)
          .map(callRow),
      );
    },
  };
}
