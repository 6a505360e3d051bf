// A tool's page (and the new-tool page): the form, Save, Test, Enable/Disable/Delete, and
// below it the versions, recent calls and audit rows.

import { ApiError, api, q } from "./api.js";
import { caseReport, isCaseReport } from "./cases.js";
import { clear, field, h, pretty } from "./dom.js";
import { toolForm } from "./form.js";
import { historySections } from "./history.js";
import { poll } from "./poll.js";
import { codeDiagnostics, showProblems } from "./problems.js";
import { resultView } from "./result.js";
import { schemaFormToggle } from "./schemaform.js";
import { sampleInput } from "./templates.js";
import { wizard } from "./wizard.js";

const VALIDATE_DELAY_MS = 600;

function statusLine(tool) {
  const parts = [
    h("span", { class: `status status-${tool.status}`, "data-testid": "tool-status", text: tool.status }),
    tool.status === "disabled" && tool.disabled_reason
      ? h("span", { class: "reason", text: ` — ${tool.disabled_reason}` })
      : null,
    h("span", {
      text: ` · version ${tool.version} · used ${tool.usage_count} times · ${tool.failure_count} consecutive failures`,
    }),
  ];
  if (tool.last_error)
    parts.push(h("p", { class: "last-error" }, h("strong", { text: "Last error: " }), tool.last_error));
  return parts;
}

export function toolPage(main, ctx, { toolId, language, generate }) {
  const stops = [];
  const alert = h("p", { class: "form-alert", role: "alert" });
  const note = h("p", { class: "note", role: "status" });
  const head = h("div", { class: "page-head" });
  const statusBox = h("div", { class: "tool-status" });
  const actions = h("div", { class: "actions" });
  const body = h("div");
  clear(main, head, statusBox, actions, alert, note, body);
  let tool = null;
  let form = null;
  // The version the form was filled from: Save sends it as base_version, so a version saved
  // elsewhere meanwhile is not silently overwritten (409 edit_conflict instead).
  let formVersion = null;
  const reports = h("div", { class: "result-box", "aria-live": "polite" });

  const setHead = () => {
    clear(head, h("h1", { text: tool ? `Tool: ${tool.name}` : "New tool" }), h("a", { href: "#/", text: "All tools" }));
  };

  const act = async (fn) => {
    alert.textContent = "";
    try {
      await fn();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      alert.textContent = err.message;
    }
  };

  let drawnStatus = null;
  const drawStatus = () => {
    if (!tool) return;
    clear(statusBox, statusLine(tool));
    // The buttons are redrawn only when the status changes, so a poll never takes focus away.
    if (drawnStatus === tool.status) return;
    drawnStatus = tool.status;
    const buttons = [];
    if (tool.status === "disabled") {
      buttons.push(
        h("button", {
          type: "button",
          onclick: () =>
            act(async () => setTool((await api("POST", `/v1/custom-tools/${q(tool.id)}/enable`)).data, "Enabled.")),
          text: "Enable",
        }),
      );
    } else {
      buttons.push(
        h("button", {
          type: "button",
          onclick: () =>
            act(async () =>
              setTool((await api("POST", `/v1/custom-tools/${q(tool.id)}/disable`, {})).data, "Disabled."),
            ),
          text: "Disable",
        }),
      );
    }
    buttons.push(
      h("button", {
        type: "button",
        class: "danger",
        onclick: () =>
          act(async () => {
            if (!window.confirm(`Delete the tool ${tool.name}? Its versions go with it.`)) return;
            await api("DELETE", `/v1/custom-tools/${q(tool.id)}`);
            ctx.flash(`Deleted ${tool.name}.`);
            ctx.navigate("#/");
          }),
        text: "Delete",
      }),
    );
    const hadFocus = actions.contains(document.activeElement);
    clear(actions, buttons);
    if (hadFocus) buttons[0].focus(); // Enable became Disable (or back): keep the keyboard here
  };

  let history = null;
  const setTool = (next, message) => {
    tool = next;
    setHead();
    drawStatus();
    if (message) note.textContent = message;
    if (history) history.refresh(tool);
  };

  // -- validation as you type (the API's own checks; nothing is stored)
  let seq = 0;
  let timer = null;
  let canValidate = true;
  const validate = async () => {
    if (!canValidate) return;
    const mine = ++seq;
    let payload;
    try {
      payload = { ...form.body(), workspace_id: ctx.workspaceId };
    } catch (err) {
      showProblems(formBox, err, { message: false });
      return;
    }
    try {
      await api("POST", "/v1/custom-tools/validate", payload);
      if (mine !== seq) return;
      showProblems(formBox, { details: [] }, { message: false });
      form.editor.mark([]);
      note.textContent = "No problems found.";
    } catch (err) {
      if (mine !== seq || !(err instanceof ApiError)) return;
      if (err.status === 403 || err.status === 404 || err.status === 405) {
        canValidate = false; // a read-only token, or a service without the path: Save still says
        return;
      }
      showProblems(formBox, err, { message: false });
      form.editor.mark(codeDiagnostics(err));
      note.textContent = err.message;
    }
  };
  const changed = () => {
    clearTimeout(timer);
    timer = setTimeout(validate, VALIDATE_DELAY_MS);
  };
  stops.push(() => clearTimeout(timer));

  const formBox = h("form", { class: "card", novalidate: true, "aria-label": "Tool" });
  const save = async () => {
    alert.textContent = "";
    let payload;
    try {
      payload = form.body();
    } catch (err) {
      showProblems(formBox, err);
      alert.textContent = err.message;
      return;
    }
    clear(reports);
    try {
      if (tool) {
        const res = await api("PATCH", `/v1/custom-tools/${q(tool.id)}`, { ...payload, base_version: formVersion });
        formVersion = res.data.version;
        showProblems(formBox, { details: [] }, { message: false });
        form.editor.mark([]);
        setTool(res.data, `Saved: version ${res.data.version}.`);
      } else {
        const res = await api("POST", "/v1/custom-tools", { ...payload, workspace_id: ctx.workspaceId });
        ctx.flash(`Created ${res.data.name}, version ${res.data.version}.`);
        ctx.navigate(`#/tools/${encodeURIComponent(res.data.id)}`);
      }
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.code === "tests_failed" && isCaseReport(err.details)) {
        showProblems(formBox, { details: [] }, { message: false });
        clear(reports, caseReport(err.details, err.message));
      } else {
        showProblems(formBox, err);
        form.editor.mark(codeDiagnostics(err));
      }
      alert.textContent = err.message;
    }
  };
  const runCases = async () => {
    clear(reports, h("p", { text: "Running the saved version's cases…" }));
    try {
      const run = (await api("POST", `/v1/custom-tools/${q(tool.id)}/run-tests`)).data;
      clear(reports, caseReport(run.cases, `Version ${run.version}: ${run.passed} passed, ${run.failed} failed`));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      clear(reports, h("p", { class: "form-alert", role: "alert", text: err.message }));
    }
  };
  formBox.addEventListener("submit", (e) => {
    e.preventDefault();
    save();
  });

  // -- test-run (POST /v1/custom-tools/test: the form as it is, nothing saved or counted)
  const input = h("textarea", { rows: 5, class: "mono", spellcheck: "false" });
  const output = h("div", { class: "result-box", "aria-live": "polite" });
  const schemaHost = h("div");
  const testBox = h("section", { class: "card", "aria-labelledby": "test-h" });
  const runTest = async () => {
    clear(output);
    let payload;
    let value;
    try {
      payload = form.body();
    } catch (err) {
      showProblems(formBox, err);
      clear(output, h("p", { class: "form-alert", text: err.message }));
      return;
    }
    try {
      value = JSON.parse(input.value || "{}");
    } catch (err) {
      showProblems(
        testBox,
        { details: [{ field: "input", message: `is not valid JSON: ${err.message}` }] },
        { message: false },
      );
      return;
    }
    showProblems(testBox, { details: [] }, { message: false });
    clear(output, h("p", { text: "Running…" }));
    try {
      const res = await api("POST", "/v1/custom-tools/test", {
        ...payload,
        workspace_id: ctx.workspaceId,
        input: value,
      });
      clear(output, resultView(res.data));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      showProblems(formBox, err);
      form.editor.mark(codeDiagnostics(err));
      showProblems(testBox, err, { message: false });
      clear(output, h("p", { class: "form-alert", role: "alert", text: err.message }));
    }
  };

  const build = (initial) => {
    form = toolForm(initial, { onChange: changed });
    formVersion = initial?.id ? initial.version : null;
    const saveButton = h("button", { type: "submit", class: "primary", text: "Save" });
    const buttons = [saveButton];
    // "Run cases", not "Run tests": no other button's name may contain "Test" (CONTRACT 10).
    if (initial?.id) buttons.push(h("button", { type: "button", onclick: runCases, text: "Run cases" }));
    clear(formBox, form.element, h("div", { class: "actions" }, buttons), reports);
    input.value = JSON.stringify(sampleInput(initial?.input_schema), null, 2);
    clear(
      testBox,
      h("h2", { id: "test-h", text: "Test run" }),
      h("p", { class: "hint", text: "Runs the form as it is now in the sandbox; nothing is saved or counted." }),
      field("Input", input, { name: "input", hint: "JSON" }),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", onclick: runTest, text: "Test" }),
        schemaFormToggle(() => form.body().input_schema, input, schemaHost),
      ),
      schemaHost,
      output,
    );
    const parts = [];
    if (generate) {
      const wiz = wizard({
        language: () => form.controls.lang.value,
        workspaceId: ctx.workspaceId,
        onDraft: (draft) => {
          form.fill(draft);
          const example = Array.isArray(draft.examples) && draft.examples[0];
          if (example && example.input !== undefined) input.value = pretty(example.input);
          note.textContent = "The draft is in the form below: check it, then Save.";
        },
      });
      stops.push(wiz.stop);
      parts.push(wiz.element);
    }
    parts.push(formBox, testBox);
    if (initial?.id) {
      history = historySections(initial, ctx);
      parts.push(history.element);
    }
    clear(body, parts);
  };

  if (toolId) {
    api("GET", `/v1/custom-tools/${q(toolId)}`)
      .then((res) => {
        tool = res.data;
        build(tool);
        setTool(tool, ctx.takeFlash());
        stops.push(
          poll(async () => {
            try {
              const fresh = (await api("GET", `/v1/custom-tools/${q(tool.id)}`)).data;
              if (JSON.stringify(fresh) !== JSON.stringify(tool)) setTool(fresh);
            } catch (err) {
              if (err instanceof ApiError && err.status === 404) alert.textContent = err.message;
              throw err;
            }
          }, 1500),
        );
      })
      .catch((err) => {
        clear(
          main,
          h("h1", { text: "Tool" }),
          h("p", { class: "form-alert", role: "alert", text: err.message }),
          h("a", { href: "#/", text: "All tools" }),
        );
      });
  } else {
    setHead();
    build({ language: language || "python" });
  }
  return () => {
    for (const s of stops) s();
  };
}
