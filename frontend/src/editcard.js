// The tool's form in its card: Save (a create, or a new version of a saved tool), Run cases
// on a saved tool, and the API's checks as you type. Save sends the version the form was
// filled from as base_version, so a version saved elsewhere meanwhile is not overwritten (the
// API answers 409 edit_conflict instead).

import { ApiError, api, q } from "./api.js";
import { caseReport, isCaseReport } from "./cases.js";
import { clear, h } from "./dom.js";
import { toolForm } from "./form.js";
import { codeDiagnostics, showProblems } from "./problems.js";
import { liveValidation } from "./validate.js";

// onChange: called after each edit of the form (the test run follows the schema with it).
export function editCard(initial, page, { onChange } = {}) {
  const saved = Boolean(initial?.id);
  let baseVersion = saved ? initial.version : null;
  const box = h("form", { class: "card", novalidate: true, "aria-label": "Tool" });
  const reports = h("div", { class: "result-box", "aria-live": "polite" });
  const check = liveValidation({ form: () => form, box, workspaceId: page.ctx.workspaceId, say: page.say });
  const form = toolForm(initial, {
    limits: page.limits,
    onChange: () => {
      check.changed();
      if (onChange) onChange();
    },
  });

  const save = async () => {
    page.fail("");
    let payload;
    try {
      payload = form.body();
    } catch (err) {
      showProblems(box, err);
      page.fail(err.message);
      return;
    }
    clear(reports);
    try {
      if (saved) {
        const path = `/v1/custom-tools/${q(initial.id)}`;
        const res = await api("PATCH", path, { ...payload, base_version: baseVersion });
        baseVersion = res.data.version;
        showProblems(box, { details: [] }, { message: false });
        form.editor.mark([]);
        page.setTool(res.data, `Saved: version ${res.data.version}.`);
      } else {
        const res = await api("POST", "/v1/custom-tools", { ...payload, workspace_id: page.ctx.workspaceId });
        page.ctx.flash(`Created ${res.data.name}, version ${res.data.version}.`);
        page.ctx.navigate(`#/tools/${encodeURIComponent(res.data.id)}`);
      }
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.code === "tests_failed" && isCaseReport(err.details)) {
        showProblems(box, { details: [] }, { message: false });
        clear(reports, caseReport(err.details, err.message));
      } else {
        showProblems(box, err);
        form.editor.mark(codeDiagnostics(err));
      }
      page.fail(err.message);
    }
  };

  const runCases = async () => {
    clear(reports, h("p", { text: "Running the saved version's cases…" }));
    try {
      const run = (await api("POST", `/v1/custom-tools/${q(initial.id)}/run-tests`)).data;
      clear(reports, caseReport(run.cases, `Version ${run.version}: ${run.passed} passed, ${run.failed} failed`));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      clear(reports, h("p", { class: "form-alert", role: "alert", text: err.message }));
    }
  };

  box.addEventListener("submit", (e) => {
    e.preventDefault();
    save();
  });
  const buttons = [h("button", { type: "submit", class: "primary", text: "Save" })];
  // "Run cases", not "Run tests": no other button's name may contain "Test" (CONTRACT 10).
  if (saved) buttons.push(h("button", { type: "button", onclick: runCases, text: "Run cases" }));
  clear(box, form.element, h("div", { class: "actions" }, buttons), reports);
  return { element: box, form, stop: check.stop };
}
