// The API's own checks as you type (POST /v1/custom-tools/validate, which stores nothing):
// a moment after the last change, the draft's problems are written under their fields and
// marked in the editor, and the status line says how many there are, in the error colour.

import { ApiError, api } from "./api.js";
import { codeDiagnostics, showProblems } from "./problems.js";

const DELAY_MS = 600;

// form(): the tool form (form.js); box: the element holding its fields.
export function liveValidation({ form, box, workspaceId, say }) {
  let seq = 0;
  let timer = null;
  let enabled = true;
  const validate = async () => {
    if (!enabled) return;
    const mine = ++seq;
    let payload;
    try {
      payload = { ...form().body(), workspace_id: workspaceId };
    } catch (err) {
      showProblems(box, err, { message: false });
      return;
    }
    try {
      await api("POST", "/v1/custom-tools/validate", payload);
      if (mine !== seq) return;
      showProblems(box, { details: [] }, { message: false });
      form().editor.mark([]);
      say("No problems found.");
    } catch (err) {
      if (mine !== seq || !(err instanceof ApiError)) return;
      if (err.status === 403 || err.status === 404 || err.status === 405) {
        enabled = false; // a read-only token, or a service without the path: Save still says
        return;
      }
      showProblems(box, err, { message: false });
      form().editor.mark(codeDiagnostics(err));
      say(err.message, { problem: true });
    }
  };
  return {
    changed() {
      clearTimeout(timer);
      timer = setTimeout(validate, DELAY_MS);
    },
    stop() {
      clearTimeout(timer);
    },
  };
}
