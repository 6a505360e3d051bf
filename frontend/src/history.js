// Below a saved tool: its versions (with a diff between any two), its recent calls (each
// Result on demand) and its audit rows.

import { diffLines } from "diff";

import { all, api, q } from "./api.js";
import { clear, field, h, pretty, when } from "./dom.js";
import { resultView } from "./result.js";

function versionText(v) {
  return [
    `language: ${v.language}`,
    `timeout_ms: ${v.timeout_ms}`,
    `description: ${v.description || ""}`,
    "input_schema:",
    pretty(v.input_schema),
    "code:",
    v.code,
  ].join("\n");
}

function diffView(a, b) {
  const lines = [];
  for (const part of diffLines(versionText(a), versionText(b))) {
    const mark = part.added ? "+" : part.removed ? "-" : " ";
    const cls = part.added ? "add" : part.removed ? "del" : "same";
    for (const line of part.value.replace(/\n$/, "").split("\n")) {
      lines.push(h("span", { class: `diff-${cls}`, text: `${mark} ${line}\n` }));
    }
  }
  return h("pre", { class: "diff", "aria-label": `Changes from version ${a.version} to ${b.version}` }, lines);
}

export function historySections(initial, _ctx) {
  let tool = initial;
  const versionsList = h("ul", { class: "versions", "aria-label": "Versions" });
  const from = h("select");
  const to = h("select");
  const diffOut = h("div", { "aria-live": "polite" });
  const versionsAlert = h("p", { class: "form-alert", role: "alert" });
  const callsBody = h("tbody");
  const callOut = h("div", { class: "result-box", "aria-live": "polite" });
  const auditBody = h("tbody");
  const cache = new Map();

  const version = async (n) => {
    if (!cache.has(n)) cache.set(n, (await api("GET", `/v1/custom-tools/${q(tool.id)}/versions/${n}`)).data);
    return cache.get(n);
  };

  const showDiff = async () => {
    versionsAlert.textContent = "";
    try {
      const [a, b] = await Promise.all([version(Number(from.value)), version(Number(to.value))]);
      clear(diffOut, diffView(a, b));
    } catch (err) {
      versionsAlert.textContent = err.message;
    }
  };

  const loadVersions = async () => {
    const versions = await all(`/v1/custom-tools/${q(tool.id)}/versions`);
    versions.sort((a, b) => b.version - a.version);
    clear(
      versionsList,
      versions.map((v) =>
        h("li", {}, h("strong", { text: `Version ${v.version}` }), ` · ${when(v.created_at)} · ${v.language}`),
      ),
    );
    const options = () => versions.map((v) => h("option", { value: String(v.version), text: `version ${v.version}` }));
    const keepFrom = from.value;
    const keepTo = to.value;
    clear(from, options());
    clear(to, options());
    to.value = keepTo && versions.some((v) => String(v.version) === keepTo) ? keepTo : String(versions[0].version);
    const older = versions[1] ? versions[1].version : versions[0].version;
    from.value = keepFrom && versions.some((v) => String(v.version) === keepFrom) ? keepFrom : String(older);
  };

  const showCall = async (id) => {
    try {
      // Named in the tool's workspace: ids are the callers' own, unique per workspace only,
      // and an admin's lookup without it shows the newest call of that id in any workspace
      // (another workspace's result shown as this tool's, until 2026-12-06).
      const path = `/v1/tool-calls/${q(id)}?workspace_id=${q(tool.workspace_id)}`;
      clear(callOut, resultView((await api("GET", path)).data));
    } catch (err) {
      clear(callOut, h("p", { class: "form-alert", role: "alert", text: err.message }));
    }
  };

  // The audit lists oldest first: remember the cursor of the last full page, so a refresh
  // reads only what is new (one request, usually), and keep the newest rows.
  let auditCursor = null;
  let seen = new Map();
  const loadAudit = async () => {
    let cursor = auditCursor;
    for (let i = 0; i < 100; i += 1) {
      const page = await api("GET", `/v1/audit?tool_id=${q(tool.id)}&limit=500${cursor ? `&cursor=${q(cursor)}` : ""}`);
      for (const r of page.data) seen.set(r.id, r);
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
      auditCursor = cursor;
    }
    const rows = [...seen.values()].sort((a, b) => Number(b.id) - Number(a.id)).slice(0, 200);
    seen = new Map(rows.map((r) => [r.id, r]));
    const calls = rows.filter((r) => r.event === "tool.invoked").slice(0, 20);
    const shown = rows.slice(0, 50);
    clear(
      callsBody,
      calls.map((r) => {
        const d = r.data && typeof r.data === "object" ? r.data : {};
        return h(
          "tr",
          {},
          h("td", { text: when(r.created_at) }),
          h("td", { text: String(d.status ?? "") }),
          h("td", { class: "num", text: d.duration_ms === undefined ? "" : `${d.duration_ms} ms` }),
          h("td", { text: r.source || "" }),
          h(
            "td",
            {},
            r.tool_call_id
              ? h("button", {
                  type: "button",
                  class: "link",
                  onclick: () => showCall(r.tool_call_id),
                  text: "Show result",
                  "aria-label": `Show result of call ${r.tool_call_id}`,
                })
              : "",
          ),
        );
      }),
    );
    clear(
      auditBody,
      shown.map((r) =>
        h(
          "tr",
          {},
          h("td", { text: when(r.created_at) }),
          h("td", { text: r.event }),
          h("td", { text: r.source || "" }),
          h("td", {}, h("pre", { class: "wrap", text: pretty(r.data) })),
        ),
      ),
    );
  };

  const refreshAll = async () => {
    try {
      await Promise.all([loadVersions(), loadAudit()]);
    } catch (err) {
      versionsAlert.textContent = err.message;
    }
  };

  const table = (caption, cols, tbody) =>
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        {},
        h("caption", { text: caption }),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            cols.map((c) => h("th", { scope: "col", text: c })),
          ),
        ),
        tbody,
      ),
    );

  const element = h(
    "div",
    {},
    h(
      "section",
      { class: "card", "aria-labelledby": "versions-h" },
      h("h2", { id: "versions-h", text: "Versions" }),
      versionsList,
      h("div", { class: "filters" }, field("From version", from), field("To version", to)),
      h("div", { class: "actions" }, h("button", { type: "button", onclick: showDiff, text: "Show diff" })),
      versionsAlert,
      diffOut,
    ),
    h(
      "section",
      { class: "card", "aria-labelledby": "calls-h" },
      h("h2", { id: "calls-h", text: "Recent calls" }),
      table("Recent calls of this tool", ["When", "Status", "Duration", "Source", "Result"], callsBody),
      callOut,
    ),
    h(
      "section",
      { class: "card", "aria-labelledby": "audit-h" },
      h("h2", { id: "audit-h", text: "Audit" }),
      table("Audit rows of this tool", ["When", "Event", "Source", "Data"], auditBody),
    ),
  );
  refreshAll();
  return {
    element,
    refresh(next) {
      const moved =
        next.version !== tool.version || next.usage_count !== tool.usage_count || next.status !== tool.status;
      tool = next;
      if (moved) refreshAll();
    },
  };
}
