// The test run (POST /v1/custom-tools/test): the form as it is now, run in the sandbox with
// the Input JSON; nothing is saved or counted. Input starts from the schema (sample.js) and
// follows Parameters until it is edited. A definition the API refuses is reported here in
// full (each problem with its field and line), as well as next to the fields it names.

import { ApiError, api } from "./api.js";
import { clear, field, h, pretty, section } from "./dom.js";
import { codeDiagnostics, problemList, showProblems } from "./problems.js";
import { resultView } from "./result.js";
import { sampleInput } from "./sample.js";
import { schemaFormToggle } from "./schemaform.js";

const ROWS = [5, 14]; // the Input box grows with its sample, within these

const INPUT_PROBLEM = (err) => ({ details: [{ field: "input", message: `is not valid JSON: ${err.message}` }] });

// edit: the form's card (editcard.js); workspaceId: where the run happens.
export function testRun(edit, workspaceId) {
  const { form, element: formBox } = edit;
  const input = h("textarea", { rows: 5, class: "mono", spellcheck: "false" });
  const output = h("div", { class: "result-box", "aria-live": "polite" });
  const schemaHost = h("div");
  const schema = () => form.body().input_schema;

  const setText = (text) => {
    input.value = text;
    input.rows = Math.min(Math.max(text.split("\n").length, ROWS[0]), ROWS[1]);
  };
  let sample = "";
  const follow = () => {
    if (input.value !== sample) return; // edited by hand, or filled from a draft: kept
    try {
      sample = pretty(sampleInput(schema()));
    } catch {
      return; // Parameters is not JSON yet: keep the last sample
    }
    setText(sample);
  };

  const refused = (err) => {
    showProblems(formBox, err);
    form.editor.mark(codeDiagnostics(err));
    showProblems(box, err, { message: false });
    clear(output, h("div", { class: "form-alert", role: "alert" }, h("p", { text: err.message }), problemList(err)));
  };

  const run = async () => {
    clear(output);
    let payload;
    let value;
    try {
      payload = form.body();
    } catch (err) {
      refused(err);
      return;
    }
    try {
      value = JSON.parse(input.value || "{}");
    } catch (err) {
      showProblems(box, INPUT_PROBLEM(err), { message: false });
      return;
    }
    showProblems(box, { details: [] }, { message: false });
    clear(output, h("p", { text: "Running…" }));
    try {
      const res = await api("POST", "/v1/custom-tools/test", { ...payload, workspace_id: workspaceId, input: value });
      clear(output, resultView(res.data));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      refused(err);
    }
  };

  const box = section(
    "test-h",
    "Test run",
    h("p", { class: "hint", text: "Runs the form as it is now in the sandbox; nothing is saved or counted." }),
    field("Input", input, { name: "input", hint: "JSON, from the schema's examples and defaults" }),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "button", onclick: run, text: "Test" }),
      schemaFormToggle(schema, input, schemaHost),
    ),
    schemaHost,
    output,
  );
  follow();
  return {
    element: box,
    schemaChanged: follow,
    setInput(value) {
      setText(pretty(value));
    },
  };
}
