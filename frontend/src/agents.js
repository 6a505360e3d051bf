// Agents: which custom tools each agent has, enabled or not, pinned to a version or latest.

import { ApiError, all, api, q } from "./api.js";
import { clear, field, h } from "./dom.js";
import { paged, serviceLimits } from "./limits.js";
import { showProblems } from "./problems.js";

export function agentsPage(main, ctx) {
  const alert = h("p", { class: "form-alert", role: "alert" });
  const note = h("p", { class: "note", role: "status" });
  const picker = h("select");
  const newName = h("input", { type: "text", autocomplete: "off" });
  const createForm = h(
    "form",
    { class: "card", "aria-label": "New agent", novalidate: true },
    h("div", { class: "form-alert", role: "alert" }),
    field("Agent name", newName, { name: "name" }),
    h("div", { class: "actions" }, h("button", { type: "submit", text: "Create agent" })),
  );
  const tbody = h("tbody");
  const table = h(
    "table",
    {},
    h("caption", { text: "Custom tools for this agent" }),
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Tool", "Status", "Enabled for the agent", "Version"].map((c) => h("th", { scope: "col", text: c })),
      ),
    ),
    tbody,
  );
  clear(
    main,
    h("div", { class: "page-head" }, h("h1", { text: "Agents" })),
    alert,
    note,
    createForm,
    field("Agent", picker),
    h("div", { class: "scroll" }, table),
  );

  let agents = [];
  const drawTools = async () => {
    clear(tbody);
    const agent = agents.find((a) => a.id === picker.value);
    if (!agent) return;
    const [tools, enabled] = await Promise.all([
      serviceLimits().then((limits) => all(paged(`/v1/custom-tools?workspace_id=${q(ctx.workspaceId)}`, limits))),
      api("GET", `/v1/agents/${q(agent.id)}/custom-tools`),
    ]);
    const pins = new Map(enabled.data.map((e) => [e.tool_id, e.version]));
    tools.sort((a, b) => a.name.localeCompare(b.name));
    for (const tool of tools) {
      const on = h("input", {
        type: "checkbox",
        checked: pins.has(tool.id),
        "aria-label": `Enable ${tool.name} for ${agent.name}`,
      });
      const pin = h(
        "select",
        { "aria-label": `Version of ${tool.name} for ${agent.name}` },
        h("option", { value: "", text: "latest" }),
      );
      for (let v = tool.version; v >= 1; v -= 1) pin.append(h("option", { value: String(v), text: `version ${v}` }));
      pin.value = pins.get(tool.id) ? String(pins.get(tool.id)) : "";
      pin.disabled = !pins.has(tool.id);
      const apply = async () => {
        alert.textContent = "";
        try {
          if (on.checked) {
            const version = pin.value ? Number(pin.value) : null;
            await api("PUT", `/v1/agents/${q(agent.id)}/custom-tools/${q(tool.id)}`, { version });
            note.textContent = `${tool.name} is enabled for ${agent.name}${version ? ` at version ${version}` : " (latest)"}.`;
          } else {
            await api("DELETE", `/v1/agents/${q(agent.id)}/custom-tools/${q(tool.id)}`);
            note.textContent = `${tool.name} is no longer enabled for ${agent.name}.`;
          }
          pin.disabled = !on.checked;
        } catch (err) {
          if (!(err instanceof ApiError)) throw err;
          alert.textContent = err.message;
          on.checked = pins.has(tool.id);
        }
      };
      on.addEventListener("change", apply);
      pin.addEventListener("change", apply);
      const status = tool.enable_globally ? `${tool.status}, enabled globally` : tool.status;
      tbody.append(
        h(
          "tr",
          {},
          h("th", { scope: "row" }, h("a", { href: `#/tools/${encodeURIComponent(tool.id)}`, text: tool.name })),
          h("td", { text: status }),
          h("td", {}, on),
          h("td", {}, pin),
        ),
      );
    }
  };
  const load = async (select) => {
    agents = await all(`/v1/agents?workspace_id=${q(ctx.workspaceId)}`);
    clear(
      picker,
      agents.map((a) => h("option", { value: a.id, text: a.name })),
    );
    if (select) picker.value = select;
    await drawTools();
  };
  picker.addEventListener("change", () => drawTools().catch((err) => (alert.textContent = err.message)));
  createForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const res = await api("POST", "/v1/agents", { workspace_id: ctx.workspaceId, name: newName.value.trim() });
      showProblems(createForm, { details: [] }, { message: false });
      newName.value = "";
      await load(res.data.id);
      note.textContent = `Created agent ${res.data.name}.`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      showProblems(createForm, err);
    }
  });
  load().catch((err) => (alert.textContent = err.message));
  return () => {};
}
