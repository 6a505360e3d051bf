// A tool's page (and the new-tool page): its status and actions, the wizard when asked for,
// the form with Save, the test run, and below a saved tool its versions, recent calls and
// audit rows. Each of those is its own module; this one loads the tool and the service's
// limits, lays the parts out and keeps them in step with the tool as it changes.

import { ApiError, api, q } from "./api.js";
import { auditSection } from "./audit.js";
import { auditFeed } from "./auditfeed.js";
import { callsSection } from "./calls.js";
import { statsSection } from "./charts.js";
import { clear, h, say } from "./dom.js";
import { editCard } from "./editcard.js";
import { limitsFor } from "./limits.js";
import { poll } from "./poll.js";
import { testRun } from "./testrun.js";
import { toolStatus } from "./toolstatus.js";
import { versionsSection } from "./versions.js";
import { wizard } from "./wizard.js";

// Stats, versions, calls and audit of a saved tool; refresh(tool) reads again what a change
// moved.
function historyOf(tool, limits) {
  const versions = versionsSection(tool, limits);
  const stats = statsSection(tool);
  const calls = callsSection(tool);
  const audit = auditSection();
  const read = auditFeed(tool.id, limits);
  const alert = h("p", { class: "form-alert", role: "alert" });
  const readRows = async () => {
    try {
      const rows = await read();
      alert.textContent = "";
      calls.draw(rows);
      audit.draw(rows);
    } catch (err) {
      alert.textContent = err.message;
    }
  };
  let seen = tool;
  const readAll = () => Promise.all([versions.refresh(), readRows(), stats.refresh()]);
  readAll();
  return {
    elements: [stats.element, versions.element, alert, calls.element, audit.element],
    refresh(next) {
      const moved =
        next.version !== seen.version || next.usage_count !== seen.usage_count || next.status !== seen.status;
      seen = next;
      if (moved) readAll();
    },
  };
}

export function toolPage(main, ctx, { toolId, language, generate }) {
  const stops = [];
  const alert = h("p", { class: "form-alert", role: "alert" });
  const note = h("p", { class: "note", role: "status" });
  const head = h("div", { class: "page-head" });
  const body = h("div");
  let history = null;
  const page = {
    ctx,
    limits: null,
    tool: null,
    say: (text, options) => say(note, text, options),
    fail: (text) => {
      alert.textContent = text;
    },
    setTool(next, message) {
      page.tool = next;
      drawHead();
      status.draw(next);
      if (message) page.say(message);
      if (history) history.refresh(next);
    },
  };
  const status = toolStatus(page);
  const drawHead = () => {
    const title = page.tool ? `Tool: ${page.tool.name}` : "New tool";
    clear(head, h("h1", { text: title }), h("a", { href: "#/", text: "All tools" }));
  };
  clear(main, head, status.element, alert, note, body);

  const build = (initial) => {
    let run = null;
    const edit = editCard(initial, page, { onChange: () => run?.schemaChanged() });
    run = testRun(edit, ctx.workspaceId);
    stops.push(edit.stop);
    const parts = [];
    if (generate) {
      const wiz = wizard({
        language: () => edit.form.controls.lang.value,
        workspaceId: ctx.workspaceId,
        limits: page.limits,
        onDraft: (draft) => {
          edit.form.fill(draft);
          const example = Array.isArray(draft.examples) && draft.examples[0];
          if (example && example.input !== undefined) run.setInput(example.input);
          page.say("The draft is in the form below: check it, then Save.");
        },
      });
      stops.push(wiz.stop);
      parts.push(wiz.element);
    }
    parts.push(edit.element, run.element);
    if (initial.id) {
      history = historyOf(initial, page.limits);
      parts.push(...history.elements);
    }
    clear(body, parts);
  };

  const watch = (id) =>
    poll(async () => {
      try {
        const fresh = (await api("GET", `/v1/custom-tools/${q(id)}`)).data;
        if (JSON.stringify(fresh) !== JSON.stringify(page.tool)) page.setTool(fresh);
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) page.fail(err.message);
        throw err;
      }
    });

  const open = async () => {
    page.limits = await limitsFor(ctx.workspaceId);
    if (left) return;
    if (!toolId) {
      drawHead();
      build({ language: language || "python" });
      return;
    }
    const tool = (await api("GET", `/v1/custom-tools/${q(toolId)}`)).data;
    if (left) return;
    build(tool);
    page.setTool(tool, ctx.takeFlash());
    stops.push(watch(tool.id));
  };
  let left = false;
  stops.push(() => {
    left = true;
  });
  open().catch((err) => {
    if (left) return;
    clear(
      main,
      h("h1", { text: "Tool" }),
      h("p", { class: "form-alert", role: "alert", text: err.message }),
      h("a", { href: "#/", text: "All tools" }),
    );
  });
  return () => {
    for (const stop of stops) stop();
  };
}
