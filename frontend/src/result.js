// A Result as the user reads it: status, message, error, raw data, what the model sees,
// what the user sees (render, interactive), duration and ctx calls. All of it is tool output.

import { h, none, pretty } from "./dom.js";
import { markdown, outsideImage, safeImage, safeLink } from "./safe.js";

// Text the tool wrote, as it is; an empty or missing one is said to be empty.
function text(value, props) {
  if (value === undefined || value === null || value === "") return none(props);
  return h("pre", { class: "wrap", ...props, text: String(value) });
}

function cellText(v) {
  return typeof v === "string" ? v : pretty(v);
}

export function renderView(render) {
  if (!render || typeof render !== "object") return none();
  switch (render.type) {
    case "markdown":
      return markdown(render.markdown);
    case "table": {
      const cols = Array.isArray(render.columns) ? render.columns : [];
      const rows = Array.isArray(render.rows) ? render.rows : [];
      return h(
        "div",
        { class: "scroll" },
        h(
          "table",
          { class: "render-table" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              cols.map((c) => h("th", { scope: "col", text: cellText(c) })),
            ),
          ),
          h(
            "tbody",
            {},
            rows.map((r) =>
              h(
                "tr",
                {},
                (Array.isArray(r) ? r : [r]).map((c) => h("td", { text: cellText(c) })),
              ),
            ),
          ),
        ),
      );
    }
    case "image": {
      const src = safeImage(render.url);
      const alt = typeof render.alt === "string" ? render.alt : "";
      if (!src) return h("p", {}, outsideImage(render.url, alt));
      return h("img", { src, alt, class: "render-image", referrerpolicy: "no-referrer" });
    }
    case "file": {
      const href = safeLink(render.url);
      const name = typeof render.filename === "string" ? render.filename : "file";
      if (!href) return h("p", { text: `${name} (link not shown)` });
      return h("p", {}, h("a", { href, rel: "noopener noreferrer nofollow", download: "", text: name }));
    }
    case "json":
      return h("pre", { text: pretty(render.data) });
    default:
      return h("pre", { text: pretty(render) });
  }
}

function actionText(action) {
  if (!action || typeof action !== "object") return "";
  if (action.type === "call_tool") return `calls ${cellText(action.tool)}`;
  if (action.type === "message") return `says ${cellText(action.text)}`;
  if (action.type === "open_url") return `opens ${cellText(action.url)}`;
  return cellText(action.type);
}

// Interactive elements are shown, not made live: their labels are tool text, so they are
// plain text chips (never buttons whose names could shadow the view's own controls).
export function interactiveView(ui) {
  if (!ui || typeof ui !== "object") return none();
  const parts = [];
  if (ui.prompt) parts.push(h("p", { text: cellText(ui.prompt) }));
  if (ui.type === "buttons" && Array.isArray(ui.buttons)) {
    parts.push(
      h(
        "ul",
        { class: "chips" },
        ui.buttons.map((b) => h("li", { text: `${cellText(b?.label)} — ${actionText(b?.action)}` })),
      ),
    );
  } else if (ui.type === "form") {
    const fields = Array.isArray(ui.fields) ? ui.fields : [];
    parts.push(
      h(
        "ul",
        { class: "chips" },
        fields.map((f) => h("li", { text: cellText(f && (f.label || f.name)) })),
      ),
    );
    if (ui.submit)
      parts.push(h("p", { text: `submit: ${cellText(ui.submit.label)} — ${actionText(ui.submit.action)}` }));
  } else parts.push(h("pre", { text: pretty(ui) }));
  return h("div", { class: "interactive" }, parts);
}

// What the code printed: text, whatever it looks like.
function logsView(logs) {
  const l = logs && typeof logs === "object" ? logs : {};
  const out = typeof l.stdout === "string" ? l.stdout : "";
  const err = typeof l.stderr === "string" ? l.stderr : "";
  if (!out && !err) return none({ "data-testid": "result-logs" });
  return h(
    "div",
    { "data-testid": "result-logs" },
    out ? [h("p", { class: "hint", text: "stdout" }), h("pre", { class: "wrap", text: out })] : null,
    err ? [h("p", { class: "hint", text: "stderr" }), h("pre", { class: "wrap", text: err })] : null,
  );
}

export function resultView(result) {
  const r = result || {};
  const rows = [
    [
      "Status",
      h("span", {
        class: `status status-${r.status === "ok" ? "ok" : "error"}`,
        "data-testid": "result-status",
        text: String(r.status),
      }),
    ],
    ["Message", text(r.message, { "data-testid": "result-message" })],
  ];
  if (r.error) {
    rows.push([
      "Error",
      h(
        "div",
        {},
        h("p", { text: `${cellText(r.error.code)}: ${cellText(r.error.message)}` }),
        r.error.details == null ? null : h("pre", { text: pretty(r.error.details) }),
      ),
    ]);
  }
  rows.push(
    ["Raw data", r.raw_data == null ? none({ "data-testid": "result-raw" }) : h("pre", { text: pretty(r.raw_data) })],
    ["LLM", text(r.llm, { "data-testid": "result-llm" })],
    ["Render", renderView(r.render)],
    ["Interactive", interactiveView(r.interactive)],
    ["Logs", logsView(r.logs)],
    ["Duration", `${r.duration_ms ?? "?"} ms`],
    ["ctx calls", String(r.ctx_calls ?? 0)],
  );
  if (r.tool_call_id) rows.push(["Call id", h("code", { text: r.tool_call_id })]);
  return h(
    "dl",
    { class: "result" },
    rows.map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]),
  );
}
