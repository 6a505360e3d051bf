// Workspace secrets: the list (name, hosts, when made, changed and last used; never a value),
// a form to add one, and per secret: new hosts, a new value, delete. Values are write-only:
// the service never sends one back, and the field is emptied once it is sent.

import { ApiError, api, q } from "./api.js";
import { clear, field, h, say, when } from "./dom.js";
import { showProblems } from "./problems.js";

const hostsOf = (text) =>
  text
    .split(/[\n,]/)
    .map((s) => s.trim())
    .filter(Boolean);

// A text field whose characters are masked (not type=password: browsers would offer to store it).
const valueInput = (label) =>
  h("input", { type: "text", class: "secret", autocomplete: "off", spellcheck: "false", "aria-label": label });

export function secretsPage(main, ctx) {
  const base = `/v1/workspaces/${q(ctx.workspaceId)}/secrets`;
  const status = h("p", { class: "note", role: "status" });
  const alert = h("p", { class: "form-alert", role: "alert" });
  const name = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
  const value = valueInput(null);
  const hosts = h("textarea", { rows: 2, class: "mono", spellcheck: "false" });
  const form = h(
    "form",
    { class: "card", "aria-label": "New secret", novalidate: true },
    h("h2", { text: "New secret" }),
    h("div", { class: "form-alert", role: "alert" }),
    field("Name", name, { name: "name", hint: "letters, digits and _; code writes it {{secrets.NAME}}" }),
    field("Value", value, { name: "value", hint: "write-only: never shown again" }),
    field("Hosts", hosts, { name: "hosts", hint: "the hosts it may be sent to, one a line (as in an egress list)" }),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", text: "Add secret" })),
  );
  const tbody = h("tbody");
  const table = h(
    "table",
    {},
    h("caption", { text: "Secrets of this workspace" }),
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Name", "Hosts", "Changed", "Last used", "Change"].map((c) => h("th", { scope: "col", text: c })),
      ),
    ),
    tbody,
  );
  clear(
    main,
    h("div", { class: "page-head" }, h("h1", { text: "Secrets" })),
    h("p", {
      text: "Tools send these with http_request, only to their hosts. The service fills them in; tool code never sees a value.",
    }),
    status,
    alert,
    form,
    h("div", { class: "scroll" }, table),
  );

  const row = (s) => {
    const newHosts = h("textarea", {
      rows: 2,
      class: "mono",
      spellcheck: "false",
      "aria-label": `Hosts of ${s.name}`,
      text: s.hosts.join("\n"),
    });
    const newValue = valueInput(`New value of ${s.name}`);
    newValue.placeholder = "new value (leave empty to keep it)";
    const problems = h("p", { class: "form-alert", role: "alert" });
    const save = async () => {
      const change = { hosts: hostsOf(newHosts.value) };
      if (newValue.value) change.value = newValue.value;
      try {
        await api("PATCH", `${base}/${q(s.name)}`, change);
        newValue.value = "";
        say(status, `Saved ${s.name}.`);
        await load();
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        problems.textContent = [err.message, ...(err.details || []).map((p) => `${p.field}: ${p.message}`)].join(" ");
      }
    };
    const remove = async () => {
      if (!window.confirm(`Delete the secret ${s.name}? Tools that send it will be refused.`)) return;
      try {
        await api("DELETE", `${base}/${q(s.name)}`);
        say(status, `Deleted ${s.name}.`);
        await load();
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        problems.textContent = err.message;
      }
    };
    return h(
      "tr",
      {},
      h("th", { scope: "row", class: "mono", text: s.name }),
      h("td", { class: "mono", text: s.hosts.join(", ") }),
      h("td", { text: when(s.updated_at) }),
      h("td", { text: s.last_used_at ? when(s.last_used_at) : "never" }),
      h(
        "td",
        {},
        newHosts,
        newValue,
        h(
          "div",
          { class: "actions" },
          h("button", { type: "button", onclick: save, text: `Save ${s.name}` }),
          h("button", { type: "button", class: "danger", onclick: remove, text: `Delete ${s.name}` }),
        ),
        problems,
      ),
    );
  };

  const load = async () => {
    const res = await api("GET", base);
    clear(tbody, res.data.length ? res.data.map(row) : h("tr", {}, h("td", { colspan: 5, text: "No secrets yet." })));
  };

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    alert.textContent = "";
    const body = { name: name.value.trim(), value: value.value, hosts: hostsOf(hosts.value) };
    try {
      const res = await api("POST", base, body);
      showProblems(form, { details: [] }, { message: false });
      name.value = "";
      value.value = "";
      hosts.value = "";
      say(status, `Added ${res.data.name}.`);
      await load();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      showProblems(form, err);
    }
  });
  load().catch((err) => (alert.textContent = err.message));
  return () => {};
}
