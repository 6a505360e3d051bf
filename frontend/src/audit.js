// A saved tool's audit rows as a table: when, event, source, call id and a one-line outcome
// made from the row's data, the data itself folded under it (details). The data of custom.*
// rows is what tool code wrote: it is shown as text, like everything else.

import { clear, h, none, pretty, section, when } from "./dom.js";
import { cardTable, cell, row } from "./tables.js";

const SHOWN = 50;
const LINE_CHARS = 160; // an outcome made of raw data is cut to one line

const join = (...parts) => parts.filter((p) => p !== undefined && p !== null && p !== "").join(" · ");
const ms = (n) => (typeof n === "number" ? `${n} ms` : null);
const counted = (n, what) => (typeof n === "number" && n > 0 ? `${n} ${what}${n === 1 ? "" : "s"}` : null);
const version = (n) => (typeof n === "number" ? `version ${n}` : null);

// The outcome of each event the service writes (docs/api.md, Audit); others show their data.
const OUTCOMES = {
  "tool.invoked": (d) =>
    join(d.status, d.error, ms(d.duration_ms), counted(d.ctx_calls, "ctx call"), version(d.version)),
  "builtin.called": (d) => join(d.name, d.status, d.error, ms(d.duration_ms), counted(d.ctx_calls, "ctx call")),
  "tool.created": (d) => version(d.version),
  "tool.updated": (d) => join(version(d.version), Array.isArray(d.changed) ? `changed ${d.changed.join(", ")}` : null),
  "tool.deleted": (d) => version(d.version),
  "tool.enabled": (d) => (d.previous_status ? `was ${d.previous_status}` : null),
  "tool.disabled": (d) => join(d.reason, counted(d.failure_count, "failure")),
  "tool.generated": (d) => join(d.outcome, counted(d.attempts, "attempt")),
};

function oneLine(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = String(value);
  }
  return text.length > LINE_CHARS ? `${text.slice(0, LINE_CHARS - 1)}…` : text;
}

function outcome(r) {
  const d = r.data && typeof r.data === "object" && !Array.isArray(r.data) ? r.data : null;
  const known = OUTCOMES[r.event];
  const text = known && d ? String(known(d) || "") : r.data == null ? "" : oneLine(r.data);
  const failed = d && (d.status === "error" || (d.error !== undefined && d.error !== null));
  return text ? h("span", { class: failed ? "status-error" : null, text }) : none();
}

function auditRow(r) {
  return row(
    {},
    cell("When", { text: when(r.created_at) }),
    cell("Event", {}, h("code", { text: String(r.event) })),
    cell("Source", { text: r.source || "" }),
    cell("Call id", { class: "id" }, r.tool_call_id ? h("code", { text: r.tool_call_id }) : none()),
    cell("Outcome", { class: "outcome" }, outcome(r)),
    cell(
      "Data",
      { class: "data" },
      r.data == null
        ? none()
        : h("details", {}, h("summary", { text: "Data" }), h("pre", { class: "wrap", text: pretty(r.data) })),
    ),
  );
}

export function auditSection() {
  const table = cardTable("Audit rows of this tool, newest first", [
    "When",
    "Event",
    "Source",
    "Call id",
    "Outcome",
    "Data",
  ]);
  return {
    element: section("audit-h", "Audit", table.element),
    // rows: the tool's audit rows, newest first (auditfeed.js).
    draw(rows) {
      clear(table.body, rows.slice(0, SHOWN).map(auditRow));
    },
  };
}
