// A saved tool's versions: the list, and a line diff between any two (From version, To
// version, Show diff) over language, timeout, description, egress, schema and code.

import { diffLines } from "diff";

import { all, api, q } from "./api.js";
import { clear, field, h, pretty, section, when } from "./dom.js";
import { paged } from "./limits.js";

function versionText(v) {
  return [
    `language: ${v.language}`,
    `timeout_ms: ${v.timeout_ms}`,
    `description: ${v.description || ""}`,
    `egress: ${(v.egress || []).join(", ") || "(none)"}`,
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

export function versionsSection(initial, limits) {
  const toolId = initial.id;
  const list = h("ul", { class: "versions", "aria-label": "Versions" });
  const from = h("select");
  const to = h("select");
  const out = h("div", { "aria-live": "polite" });
  const alert = h("p", { class: "form-alert", role: "alert" });
  const cache = new Map();

  const version = async (n) => {
    if (!cache.has(n)) cache.set(n, (await api("GET", `/v1/custom-tools/${q(toolId)}/versions/${n}`)).data);
    return cache.get(n);
  };

  const showDiff = async () => {
    alert.textContent = "";
    try {
      const [a, b] = await Promise.all([version(Number(from.value)), version(Number(to.value))]);
      clear(out, diffView(a, b));
    } catch (err) {
      alert.textContent = err.message;
    }
  };

  const load = async () => {
    const versions = await all(paged(`/v1/custom-tools/${q(toolId)}/versions`, limits));
    versions.sort((a, b) => b.version - a.version);
    clear(
      list,
      versions.map((v) =>
        h("li", {}, h("strong", { text: `Version ${v.version}` }), ` · ${when(v.created_at)} · ${v.language}`),
      ),
    );
    const options = () => versions.map((v) => h("option", { value: String(v.version), text: `version ${v.version}` }));
    const has = (value) => versions.some((v) => String(v.version) === value);
    const keepFrom = from.value;
    const keepTo = to.value;
    clear(from, options());
    clear(to, options());
    to.value = has(keepTo) ? keepTo : String(versions[0].version);
    from.value = has(keepFrom) ? keepFrom : String((versions[1] || versions[0]).version);
  };

  const element = section(
    "versions-h",
    "Versions",
    list,
    h("div", { class: "filters" }, field("From version", from), field("To version", to)),
    h("div", { class: "actions" }, h("button", { type: "button", onclick: showDiff, text: "Show diff" })),
    alert,
    out,
  );
  return {
    element,
    async refresh() {
      try {
        await load();
        alert.textContent = "";
      } catch (err) {
        alert.textContent = err.message;
      }
    },
  };
}
