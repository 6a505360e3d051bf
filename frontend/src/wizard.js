// The AI-assisted wizard: describe the tool, POST /v1/custom-tools/generate (progress as
// server-sent events when the service streams them), the draft filled into the form.

import { ApiError, api, session } from "./api.js";
import { clear, field, h, pretty } from "./dom.js";
import { resultView } from "./result.js";

function explain(err) {
  // Until the generator is there, the path answers 404 or 405 (it matches /{tool_id}).
  if (err.status === 404 || err.status === 405) {
    return "This service has no generator yet (POST /v1/custom-tools/generate is not there); it also needs TOOLKILN_LLM_BASE_URL.";
  }
  return err.message;
}

// Reads an event stream from a fetch response: yields {event, data} with data parsed as JSON.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    for (let cut = buffer.search(/\r?\n\r?\n/); cut >= 0; cut = buffer.search(/\r?\n\r?\n/)) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      let parsed = null;
      try {
        parsed = data.length ? JSON.parse(data.join("\n")) : null;
      } catch {
        parsed = data.join("\n");
      }
      yield { event, data: parsed };
    }
  }
}

// The service's progress events (docs/generate.md): attempt, problems, validated, example.
function progressText(event, data) {
  const d = data && typeof data === "object" ? data : {};
  const n = (v) => (typeof v === "number" ? v : "?");
  if (event === "attempt") return `Attempt ${n(d.attempt)} of ${n(d.max_attempts)}: asking the model…`;
  if (event === "problems") {
    const list = Array.isArray(d.problems) ? d.problems : [];
    const text = list.map((p) => (p && typeof p.message === "string" ? p.message : pretty(p))).join("; ");
    return `Attempt ${n(d.attempt)} had ${list.length} problem${list.length === 1 ? "" : "s"}: ${text}`;
  }
  if (event === "validated") return `Attempt ${n(d.attempt)} passed validation.`;
  if (event === "example") {
    const status = d.result && typeof d.result.status === "string" ? d.result.status : "?";
    return `Example ${typeof d.index === "number" ? d.index + 1 : "?"}: ${status}${d.passed ? "" : ", not as expected"}`;
  }
  if (event === "error") return `Error: ${typeof d.message === "string" ? d.message : pretty(d)}`;
  return String(event);
}

// Returns the wizard's element and stop(), which ends a generation under way (the page that
// holds the wizard calls it when it is left): the request is aborted, so the service stops
// asking the model, and nothing lands in a form nobody sees.
export function wizard({ language, workspaceId, limits, onDraft }) {
  const most = limits?.describeChars;
  const describe = h("textarea", { rows: 4 });
  const log = h("ol", { class: "progress", "aria-live": "polite" });
  const alert = h("p", { class: "form-alert", role: "alert" });
  const examples = h("div");
  const button = h("button", { type: "button", onclick: () => run(), text: "Generate" });
  const box = h(
    "section",
    { class: "card wizard", "aria-labelledby": "wizard-h" },
    h("h2", { id: "wizard-h", text: "Generate a tool" }),
    field("Describe the tool", describe, {
      name: "description",
      hint: `What it takes and what it answers, in plain words${typeof most === "number" ? ` (at most ${most} characters)` : ""}.`,
    }),
    h("div", { class: "actions" }, button),
    alert,
    log,
    examples,
  );
  let running = null; // the AbortController of the generation under way
  const note = (text) => log.append(h("li", { text }));
  const done = (draft) => {
    onDraft(draft);
    note("Draft ready.");
    const list = Array.isArray(draft.examples) ? draft.examples : [];
    clear(
      examples,
      list.length ? h("h3", { text: "Examples the draft was run on" }) : null,
      list.map((ex) =>
        h("div", { class: "example" }, h("pre", { text: `input: ${pretty(ex.input)}` }), resultView(ex.result)),
      ),
    );
  };
  const generate = async (signal) => {
    const body = { workspace_id: workspaceId, description: describe.value, language: language() };
    const res = await api("POST", "/v1/custom-tools/generate", body, { accept: "text/event-stream", signal });
    const type = res.headers.get("content-type") || "";
    if (!type.startsWith("text/event-stream")) {
      done((await res.json()).data);
      return;
    }
    for await (const { event, data } of events(res)) {
      if (event === "draft") {
        done(data?.data ? data.data : data);
        return;
      }
      note(progressText(event, data));
      if (event === "error") {
        alert.textContent = data?.message || "The generator failed.";
        return;
      }
    }
    // The stream ended with neither a draft nor an error: the connection was cut (a proxy,
    // the service restarting). Say so rather than leave "Asking the model…" standing.
    lost();
  };
  const lost = (why) => {
    const text = "The connection to the service ended before the generation finished; nothing was saved. Try again.";
    note(why ? `${text} (${why})` : text);
    alert.textContent = text;
  };
  const run = async () => {
    if (running) return; // one generation at a time: the button is disabled meanwhile
    const controller = new AbortController();
    running = controller;
    button.disabled = true;
    box.setAttribute("aria-busy", "true");
    alert.textContent = "";
    clear(log);
    clear(examples);
    note("Asking the model…");
    try {
      await generate(controller.signal);
    } catch (err) {
      if (controller.signal.aborted) return; // stopped on purpose
      if (!(err instanceof ApiError)) {
        lost(err?.message); // the stream broke while it was read
        return;
      }
      alert.textContent = explain(err);
      if (err.status === 401) session.signOut();
    } finally {
      if (running === controller) {
        running = null;
        button.disabled = false;
        box.removeAttribute("aria-busy");
      }
    }
  };
  const stop = () => {
    if (running) running.abort();
  };
  return { element: box, stop };
}
