// The tool form: Name, Description, Language, Code (the editor), Parameters (JSON Schema),
// execution message, timeout, enable globally, where agents are offered it (allowed_callers),
// the hosts its code may reach (egress); and the body it sends to the API. The bounds it states (name length, timeout, ...) are the
// service's own (limits.js); a bound the service did not give is not stated.

import { field, h } from "./dom.js";
import { createEditor } from "./editor.js";
import { SCHEMA, TEMPLATES } from "./templates.js";

export class LocalProblem extends Error {
  constructor(problems) {
    super(`The form has ${problems.length} problem${problems.length === 1 ? "" : "s"}.`);
    this.code = "invalid_tool";
    this.details = problems;
  }
}

const known = (n) => typeof n === "number";

// The hint of the Timeout field for a language: its bounds in this workspace and its default.
function timeoutHint(bounds) {
  const range = known(bounds.min) && known(bounds.max) ? `${bounds.min} to ${bounds.max}` : null;
  const parts = [range || (known(bounds.max) ? `at most ${bounds.max}` : null)];
  if (known(bounds.default)) parts.push(`default ${bounds.default}`);
  return `milliseconds${parts.filter(Boolean).length ? `: ${parts.filter(Boolean).join(", ")}` : ""}`;
}

function upTo(n, what) {
  return known(n) ? `, at most ${n}${what}` : "";
}

// limits: from limitsFor() (limits.js), or null.
export function toolForm(initial, { onChange, limits } = {}) {
  const t = initial || {};
  const language = t.language || "python";
  const name = h("input", { type: "text", autocomplete: "off", spellcheck: "false", value: t.name || "" });
  const description = h("textarea", { rows: 2, text: t.description || "" });
  const lang = h(
    "select",
    {},
    h("option", { value: "python", text: "Python" }),
    h("option", { value: "javascript", text: "JavaScript" }),
  );
  lang.value = language;
  const schema = t.input_schema || SCHEMA;
  const parameters = h("textarea", {
    rows: 8,
    class: "mono",
    spellcheck: "false",
    text: JSON.stringify(schema, null, 2),
  });
  const message = h("input", { type: "text", value: t.execution_message_description || "" });
  const bounds = (lang) => limits?.timeout?.[lang] || {};
  const timeout = h("input", { type: "number", step: 1 });
  const timeoutNote = h("span", {});
  // The bounds of the form's language; a new tool's timeout starts at that language's default.
  const applyBounds = () => {
    const b = bounds(lang.value);
    for (const key of ["min", "max"]) {
      if (known(b[key])) timeout.setAttribute(key, String(b[key]));
      else timeout.removeAttribute(key);
    }
    timeoutNote.textContent = timeoutHint(b);
  };
  applyBounds();
  if (known(t.timeout_ms)) timeout.value = String(t.timeout_ms);
  else if (known(bounds(language).default)) timeout.value = String(bounds(language).default);
  const global = h("input", { type: "checkbox", checked: Boolean(t.enable_globally) });
  // Where the tool is offered to agents (CONTRACT 7a): as a tool of its own, inside code mode.
  const callers = t.allowed_callers || ["direct", "code"];
  const direct = h("input", { type: "checkbox", checked: callers.includes("direct") });
  const inCode = h("input", { type: "checkbox", checked: callers.includes("code") });
  // Hosts http_request may reach from this tool's code, one a line (docs/egress.md).
  const egress = h("textarea", {
    rows: 3,
    class: "mono",
    spellcheck: "false",
    text: (t.egress || []).join("\n"),
  });
  const cases = h("textarea", {
    rows: 4,
    class: "mono",
    spellcheck: "false",
    text: JSON.stringify(t.test_cases || [], null, 2),
  });

  const codeError = h("p", { class: "field-error", id: "code-error", "aria-live": "polite" });
  const codeHost = h("div", { class: "editor" });
  const codeField = h(
    "div",
    { class: "field", "data-field": "code" },
    h("span", { class: "label", id: "code-label", text: "Code" }),
    codeHost,
    codeError,
  );
  let pristineCode = t.code || TEMPLATES[language];
  const editor = createEditor(codeHost, {
    doc: pristineCode,
    language,
    describedBy: codeError.id,
    onChange: () => onChange?.(),
  });
  lang.addEventListener("change", () => {
    editor.setLanguage(lang.value);
    applyBounds();
    // A template nobody edited follows the language; real code is never replaced.
    if (!t.id && editor.value === pristineCode) {
      pristineCode = TEMPLATES[lang.value];
      editor.value = pristineCode;
    }
  });
  for (const el of [name, description, lang, parameters, message, timeout, global, direct, inCode, egress, cases]) {
    el.addEventListener(el.tagName === "SELECT" || el.type === "checkbox" ? "change" : "input", () => onChange?.());
  }
  const globalField = h(
    "div",
    { class: "field check", "data-field": "enable_globally" },
    h("label", {}, global, " Enable globally"),
    h("p", { class: "field-error" }),
  );
  const callersField = h(
    "fieldset",
    { class: "field check", "data-field": "allowed_callers" },
    h("legend", { text: "Offered to agents" }),
    h("label", {}, direct, " As a tool of its own (direct calls)"),
    h("label", {}, inCode, " Inside code mode (run_program)"),
    h("p", { class: "field-error" }),
  );

  const element = h(
    "div",
    { class: "tool-form" },
    field("Name", name, { name: "name", hint: `lowercase-kebab-case${upTo(limits?.nameChars, " characters")}` }),
    field("Description", description, { name: "description" }),
    field("Language", lang, { name: "language" }),
    codeField,
    field("Parameters", parameters, { name: "parameters", hint: "a JSON Schema object for the input" }),
    field("Execution message", message, {
      name: "execution_message_description",
      hint: `shown while the tool runs${upTo(limits?.messageChars, " characters")}`,
    }),
    field("Timeout (ms)", timeout, { name: "timeout_ms", hint: timeoutNote }),
    globalField,
    callersField,
    field("Egress hosts", egress, {
      name: "egress",
      hint: "hosts its code may reach through http_request, one a line: api.example.com, *.example.org, api.example.com:8443; empty: none",
    }),
    field("Test cases", cases, {
      name: "test_cases",
      hint: `JSON list of {name, input, expect}${upTo(limits?.testCases, "")}; a new version runs them before it is stored`,
    }),
  );

  return {
    element,
    editor,
    controls: { name, description, lang, parameters, message, timeout, global, direct, inCode, egress, cases },
    // The create body (without workspace_id); LocalProblem when Parameters is not JSON.
    body() {
      let inputSchema;
      try {
        inputSchema = JSON.parse(parameters.value || "{}");
      } catch (err) {
        throw new LocalProblem([{ field: "parameters", message: `is not valid JSON: ${err.message}` }]);
      }
      if (!inputSchema || typeof inputSchema !== "object" || Array.isArray(inputSchema)) {
        throw new LocalProblem([{ field: "parameters", message: "must be a JSON object (a JSON Schema)" }]);
      }
      const out = {
        name: name.value.trim(),
        description: description.value,
        language: lang.value,
        code: editor.value,
        input_schema: inputSchema,
        execution_message_description: message.value,
        enable_globally: global.checked,
        allowed_callers: [direct.checked && "direct", inCode.checked && "code"].filter(Boolean),
        egress: egress.value
          .split("\n")
          .map((line) => line.trim())
          .filter(Boolean),
      };
      try {
        out.test_cases = JSON.parse(cases.value || "[]");
      } catch (err) {
        throw new LocalProblem([{ field: "test_cases", message: `is not valid JSON: ${err.message}` }]);
      }
      if (!Array.isArray(out.test_cases)) {
        throw new LocalProblem([{ field: "test_cases", message: "must be a JSON list" }]);
      }
      // Left empty, the timeout is not sent: a new tool gets the API's default, a saved one keeps its own.
      if (timeout.value.trim() !== "") {
        out.timeout_ms = Number(timeout.value);
        if (!Number.isInteger(out.timeout_ms)) {
          throw new LocalProblem([{ field: "timeout_ms", message: "must be a whole number of milliseconds" }]);
        }
      }
      return out;
    },
    fill(draft) {
      if (draft.name) name.value = draft.name;
      if (draft.description !== undefined) description.value = draft.description || "";
      if (draft.language) {
        lang.value = draft.language;
        editor.setLanguage(draft.language);
        applyBounds();
      }
      if (typeof draft.code === "string") editor.value = draft.code;
      if (draft.input_schema) parameters.value = JSON.stringify(draft.input_schema, null, 2);
      if (draft.execution_message_description !== undefined) message.value = draft.execution_message_description || "";
      if (Array.isArray(draft.test_cases)) cases.value = JSON.stringify(draft.test_cases, null, 2);
      if (Array.isArray(draft.egress)) egress.value = draft.egress.join("\n");
      if (Array.isArray(draft.allowed_callers)) {
        direct.checked = draft.allowed_callers.includes("direct");
        inCode.checked = draft.allowed_callers.includes("code");
      }
    },
  };
}
