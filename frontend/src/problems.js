// An API failure shown where it belongs: each problem in `details` next to the field it
// names (matched by the first segment of its path), the rest and the message in the form's
// alert line; or all of them as one list where the refusal is reported (a test run). Only
// text nodes are made: messages may quote what a user typed.

import { h } from "./dom.js";

export function clearProblems(root) {
  for (const el of root.querySelectorAll(".field-error")) el.textContent = "";
  for (const el of root.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const alert = root.querySelector(".form-alert");
  if (alert) alert.textContent = "";
}

export function problemsOf(error) {
  const details = error?.details;
  if (!Array.isArray(details)) return [];
  return details.filter((p) => p && typeof p === "object" && typeof p.message === "string");
}

function where(p) {
  return p.line ? ` (line ${p.line}${p.column ? `, column ${p.column}` : ""})` : "";
}

// Aliases: the API names the schema `input_schema` or `parameters`, the form has one field.
const ALIASES = { input_schema: "parameters", workspace_id: "workspace" };

export function showProblems(root, error, { message = true } = {}) {
  clearProblems(root);
  const unplaced = [];
  for (const p of problemsOf(error)) {
    const head = String(p.field || "").split(/[.[]/)[0];
    const name = ALIASES[head] || head;
    const slot = root.querySelector(`[data-field="${CSS.escape(name)}"]`);
    const text = `${p.message}${where(p)}`;
    if (slot) {
      const err = slot.querySelector(".field-error");
      err.textContent = err.textContent ? `${err.textContent} ${text}` : text;
      const control = slot.querySelector("input, textarea, select, [role=textbox]");
      if (control) control.setAttribute("aria-invalid", "true");
    } else {
      unplaced.push(p.field ? `${p.field}: ${text}` : text);
    }
  }
  const alert = root.querySelector(".form-alert");
  if (alert && (message || unplaced.length)) {
    alert.textContent = [message ? error.message : null, ...unplaced].filter(Boolean).join(" ");
  }
}

export function codeDiagnostics(error) {
  return problemsOf(error).filter((p) => String(p.field || "").split(".")[0] === "code");
}

// Each problem as a list item: the field it names, where in it, and the message.
export function problemList(error) {
  const problems = problemsOf(error);
  if (!problems.length) return null;
  return h(
    "ul",
    { class: "problems", "aria-label": "Problems" },
    problems.map((p) =>
      h(
        "li",
        {},
        p.field ? h("code", { text: String(p.field) }) : null,
        `${where(p)}`,
        p.field || p.line ? ": " : "",
        p.message,
      ),
    ),
  );
}
