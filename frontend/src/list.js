// The list: one row per tool, counts refreshed by polling without a reload, disabled tools
// marked with their reason, filtered by name and status; each tool's calls of the last
// 24 hours (charts.js), and the tools that failed in them first.

import { all, q } from "./api.js";
import { activityChart, readStats } from "./charts.js";
import { clear, field, h } from "./dom.js";
import { paged, serviceLimits } from "./limits.js";
import { poll } from "./poll.js";
import { cardTable, cell, row } from "./tables.js";

function statusCell(tool) {
  const disabled = tool.status === "disabled";
  return [
    h("span", { class: `status status-${disabled ? "disabled" : "active"}`, text: tool.status }),
    disabled && tool.disabled_reason ? h("span", { class: "reason", text: ` — ${tool.disabled_reason}` }) : null,
  ];
}

// How often the list reads each tool's stats again (a request per tool).
const ACTIVITY_EVERY_MS = 30000;

function toolRow(tool, activity) {
  const tr = row({ "data-tool-id": tool.id });
  fill(tr, tool, activity);
  return tr;
}

function activityCell(stats) {
  if (!stats) return cell("Last 24 h", { class: "activity", text: "…" });
  const t = stats.total;
  const box = h("div", { class: "spark", role: "img" });
  const text = h("span", {
    class: t.failures ? "status-error" : "",
    text: `${t.calls} call${t.calls === 1 ? "" : "s"}${t.failures ? `, ${t.failures} failed` : ""}`,
  });
  const td = cell("Last 24 h", { class: "activity" }, box, text);
  // Drawn once the cell is in the page (uPlot measures its box).
  requestAnimationFrame(() => activityChart(box, stats));
  return td;
}

function fill(tr, tool, activity) {
  const stamp = JSON.stringify([
    tool.name,
    tool.status,
    tool.disabled_reason,
    tool.usage_count,
    tool.failure_count,
    tool.last_error,
    tool.version,
    tool.language,
    activity ? activity.to + JSON.stringify(activity.total) : null,
  ]);
  if (tr.dataset.stamp === stamp) return;
  tr.dataset.stamp = stamp;
  tr.classList.toggle("is-disabled", tool.status === "disabled");
  clear(
    tr,
    // The name is a cell like the others (CONTRACT 10: the row's cells show the name, ...).
    cell("Name", { class: "name" }, h("a", { href: `#/tools/${encodeURIComponent(tool.id)}`, text: tool.name })),
    cell("Status", {}, statusCell(tool)),
    cell("Uses", { class: "num", text: String(tool.usage_count) }),
    cell("Failures", { class: "num", text: String(tool.failure_count) }),
    cell("Last error", { class: "last-error", text: tool.last_error || "" }),
    cell("Version", { class: "num", text: String(tool.version) }),
    cell("Language", { text: tool.language }),
    activityCell(activity),
  );
}

export function listPage(main, ctx) {
  const nameFilter = h("input", { type: "search", autocomplete: "off" });
  const statusFilter = h(
    "select",
    {},
    h("option", { value: "", text: "all" }),
    h("option", { value: "active", text: "active" }),
    h("option", { value: "disabled", text: "disabled" }),
  );
  const alert = h("p", { class: "form-alert", role: "alert" });
  const note = h("p", { class: "note", role: "status", text: ctx.takeFlash() || "" });
  const empty = h("p", { class: "empty", hidden: true, text: "No tools match." });
  const summary = h("p", { class: "summary", "aria-live": "polite" });
  const table = cardTable(
    "Custom tools of this workspace",
    ["Name", "Status", "Uses", "Failures", "Last error", "Version", "Language", "Last 24 h"],
    { className: "tools" },
  );
  const tbody = table.body;
  clear(
    main,
    h(
      "div",
      { class: "page-head" },
      h("h1", { text: "Custom tools" }),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", onclick: () => ctx.navigate("#/new/python"), text: "New tool" }),
        h("button", { type: "button", onclick: () => ctx.navigate("#/generate"), text: "Generate" }),
      ),
    ),
    h("div", { class: "filters" }, field("Filter by name", nameFilter), field("Status", statusFilter)),
    alert,
    note,
    summary,
    table.element,
    empty,
  );

  const rows = new Map();
  const activity = new Map(); // tool id -> its stats of the last 24 hours
  let tools = [];
  // Failing first: the tools with failures in the last 24 hours (most first), then the
  // disabled ones, then the rest by name.
  const failing = (t) => activity.get(t.id)?.total.failures || 0;
  const order = (a, b) =>
    failing(b) - failing(a) || (a.status === "disabled") - (b.status === "disabled") || a.name.localeCompare(b.name);
  const draw = () => {
    const needle = nameFilter.value.trim().toLowerCase();
    const status = statusFilter.value;
    const shown = tools
      .filter((t) => (!needle || t.name.includes(needle)) && (!status || t.status === status))
      .sort(order);
    const keep = new Set(shown.map((t) => t.id));
    for (const [id, tr] of rows) {
      if (!keep.has(id)) {
        tr.remove();
        rows.delete(id);
      }
    }
    shown.forEach((tool, i) => {
      let tr = rows.get(tool.id);
      if (!tr) {
        tr = toolRow(tool, activity.get(tool.id));
        rows.set(tool.id, tr);
      } else fill(tr, tool, activity.get(tool.id));
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    empty.hidden = shown.length > 0;
    const disabled = tools.filter((t) => t.status === "disabled").length;
    const failed = tools.filter((t) => failing(t) > 0).length;
    summary.textContent =
      `${tools.length} tool${tools.length === 1 ? "" : "s"}, ${disabled} disabled` +
      (activity.size ? `, ${failed} with failures in the last 24 hours` : "");
  };
  const loadActivity = async () => {
    const found = await Promise.all(tools.map((t) => readStats(t.id, "24h").catch(() => null)));
    tools.forEach((t, i) => {
      if (found[i]) activity.set(t.id, found[i]);
    });
    draw();
  };
  const load = async () => {
    try {
      const path = `/v1/custom-tools?workspace_id=${q(ctx.workspaceId)}`;
      tools = await all(paged(path, await serviceLimits()));
      alert.textContent = "";
      draw();
      if (!activity.size) loadActivity().catch(() => {});
    } catch (err) {
      alert.textContent = err.message;
      throw err;
    }
  };
  nameFilter.addEventListener("input", draw);
  statusFilter.addEventListener("change", draw);
  load().catch(() => {});
  const stops = [poll(load), poll(loadActivity, ACTIVITY_EVERY_MS)];
  return () => {
    for (const stop of stops) stop();
  };
}
