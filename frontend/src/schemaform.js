// A form made from the tool's JSON Schema that writes into the Input JSON. It is built only
// when asked for: its labels are property names (tool text), which could otherwise repeat the
// names of the view's own fields ("Name", "Code", "Input").

import { clear, h, uid } from "./dom.js";

function typeOf(spec) {
  if (!spec || typeof spec !== "object") return "json";
  if (Array.isArray(spec.enum)) return "enum";
  const t = Array.isArray(spec.type) ? spec.type.find((x) => x !== "null") : spec.type;
  return ["string", "number", "integer", "boolean"].includes(t) ? t : "json";
}

function readInput(input) {
  try {
    const v = JSON.parse(input.value || "{}");
    return v && typeof v === "object" && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

function control(kind, spec, value) {
  if (kind === "boolean") return h("input", { type: "checkbox", checked: value === true });
  if (kind === "enum") {
    const select = h("select", {}, h("option", { value: "", text: "(not set)" }));
    select.append(...spec.enum.map((opt, i) => h("option", { value: String(i), text: JSON.stringify(opt) })));
    const at = spec.enum.findIndex((opt) => JSON.stringify(opt) === JSON.stringify(value));
    select.value = at >= 0 ? String(at) : "";
    return select;
  }
  if (kind === "number" || kind === "integer") {
    return h("input", {
      type: "number",
      step: kind === "integer" ? 1 : "any",
      value: typeof value === "number" ? String(value) : "",
    });
  }
  if (kind === "string") return h("input", { type: "text", value: typeof value === "string" ? value : "" });
  return h("textarea", { rows: 2, class: "mono", text: value === undefined ? "" : JSON.stringify(value) });
}

function readControl(kind, spec, el) {
  if (kind === "boolean") return el.checked;
  if (kind === "enum") return el.value === "" ? undefined : spec.enum[Number(el.value)];
  if (kind === "number" || kind === "integer") return el.value === "" ? undefined : Number(el.value);
  if (kind === "string") return el.value;
  if (el.value.trim() === "") return undefined;
  return JSON.parse(el.value);
}

// schema(): the current JSON Schema (or null); input: the Input textarea it writes into.
export function schemaForm(schema, input) {
  const box = h("fieldset", { class: "schema-form" }, h("legend", { text: "Values from the schema" }));
  const props = (schema && typeof schema === "object" && schema.properties) || {};
  const required = new Set(Array.isArray(schema?.required) ? schema.required : []);
  const current = readInput(input);
  const entries = Object.entries(props);
  if (!entries.length) box.append(h("p", { text: "The schema has no properties." }));
  for (const [key, spec] of entries) {
    const kind = typeOf(spec);
    const el = control(kind, spec, current[key]);
    el.id = uid("sf");
    const error = h("p", { class: "field-error" });
    const sync = () => {
      const next = readInput(input);
      try {
        const v = readControl(kind, spec, el);
        if (v === undefined) delete next[key];
        else next[key] = v;
        error.textContent = "";
      } catch (err) {
        error.textContent = `not valid JSON: ${err.message}`;
        return;
      }
      input.value = JSON.stringify(next, null, 2);
    };
    el.addEventListener(kind === "boolean" || kind === "enum" ? "change" : "input", sync);
    const label = `${key} (${kind === "json" ? "JSON" : kind}${required.has(key) ? ", required" : ""})`;
    const desc =
      spec && typeof spec.description === "string" ? h("p", { class: "hint", text: spec.description }) : null;
    box.append(
      kind === "boolean"
        ? h("div", { class: "field check" }, h("label", { for: el.id }, el, ` ${label}`), desc, error)
        : h("div", { class: "field" }, h("label", { for: el.id, text: label }), desc, el, error),
    );
  }
  return box;
}

export function schemaFormToggle(getSchema, input, host) {
  let open = false;
  const button = h("button", { type: "button", "aria-expanded": "false", text: "Form from schema" });
  button.addEventListener("click", () => {
    open = !open;
    button.setAttribute("aria-expanded", String(open));
    if (!open) {
      clear(host);
      return;
    }
    let schema = null;
    try {
      schema = getSchema();
    } catch {
      schema = null;
    }
    clear(
      host,
      schema ? schemaForm(schema, input) : h("p", { class: "form-alert", text: "Parameters is not valid JSON." }),
    );
  });
  return button;
}
