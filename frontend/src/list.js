// The list: one row per tool, counts refreshed by polling without a reload, disabled tools
// marked with their reason, filtered by name and status.

import { all, q } from "./api.js";
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

function toolRow(tool) {
  const tr = row({ "data-tool-id": tool.id });
  fill(tr, tool);
  return tr;
}

function fill(tr, tool) {
  const stamp = JSON.stringify([
    tool.name,
    tool.status,
    tool.disabled_reason,
    tool.usage_count,
    tool.failure_count,
    tool.last_error,
    tool.version,
    tool.language,
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
    ["Name", "Status", "Uses", "Failures", "Last error", "Version", "Language"],
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
  let tools = [];
  const draw = () => {
    const needle = nameFilter.value.trim().toLowerCase();
    const status = statusFilter.value;
    const shown = tools.filter((t) => (!needle || t.name.includes(needle)) && (!status || t.status === status));
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
        tr = toolRow(tool);
        rows.set(tool.id, tr);
      } else fill(tr, tool);
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
    });
    empty.hidden = shown.length > 0;
    const disabled = tools.filter((t) => t.status === "disabled").length;
    summary.textContent = `${tools.length} tool${tools.length === 1 ? "" : "s"}, ${disabled} disabled`;
  };
  const load = async () => {
    try {
      const path = `/v1/custom-tools?workspace_id=${q(ctx.workspaceId)}`;
      tools = await all(paged(path, await serviceLimits()));
      tools.sort((a, b) => a.name.localeCompare(b.name));
      alert.textContent = "";
      draw();
    } catch (err) {
      alert.textContent = err.message;
      throw err;
    }
  };
  nameFilter.addEventListener("input", draw);
  statusFilter.addEventListener("change", draw);
  load().catch(() => {});
  return poll(load);
}
