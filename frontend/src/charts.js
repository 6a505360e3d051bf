// Charts of a tool's stats (GET /v1/custom-tools/{id}/stats), drawn with uPlot: on a tool's
// page, calls and failures, and p50/p99 duration, per bucket of the chosen window; on the
// list, each tool's calls of the last 24 hours. Every chart has its text alternative: a
// sentence naming what it shows (its aria-label), and on the tool's page a table of the
// buckets that had calls.

import uPlot from "uplot";
import { api, q } from "./api.js";
import { clear, h, section, uid } from "./dom.js";

export const WINDOWS = ["1h", "24h", "7d"];
const OK = "#2e7d32";
const BAD = "#c62828";
const P50 = "#1565c0";
const P99 = "#6a1b9a";
const HEIGHT = 160;

export function readStats(toolId, window) {
  return api("GET", `/v1/custom-tools/${q(toolId)}/stats?window=${q(window)}`).then((r) => r.data);
}

const seconds = (iso) => Date.parse(iso) / 1000;
const ms = (v) => (v === null || v === undefined ? "no calls" : `${v} ms`);

export function summaryText(stats) {
  const t = stats.total;
  const failed = Object.entries(t.failures_by_code)
    .map(([code, n]) => `${n} ${code}`)
    .join(", ");
  return (
    `${t.calls} call${t.calls === 1 ? "" : "s"} in the last ${stats.window}, ` +
    `${t.failures} failed${failed ? ` (${failed})` : ""}; p50 ${ms(t.p50_ms)}, p99 ${ms(t.p99_ms)}.`
  );
}

// A uPlot chart that follows its box's width (at least 260 px: a 390 px screen's card).
function plot(box, options, data, least = 260) {
  const width = () => Math.max(least, box.clientWidth || least);
  const chart = new uPlot({ ...options, width: width(), height: options.height || HEIGHT }, data, box);
  const resize = new ResizeObserver(() => chart.setSize({ width: width(), height: options.height || HEIGHT }));
  resize.observe(box);
  return () => {
    resize.disconnect();
    chart.destroy();
  };
}

const bars = uPlot.paths.bars({ size: [0.8, 40] });

// The failed calls' bar is drawn over the bar of all calls: the green part is the calls
// that succeeded.
function callsChart(box, stats) {
  const x = stats.buckets.map((b) => seconds(b.start));
  const calls = stats.buckets.map((b) => b.calls);
  const failed = stats.buckets.map((b) => b.failures);
  return plot(
    box,
    {
      legend: { show: true, live: false },
      cursor: { show: false },
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
      axes: [{}, { label: "calls", size: 48 }],
      series: [
        {},
        { label: "calls", stroke: OK, fill: `${OK}55`, paths: bars, points: { show: false } },
        { label: "failed", stroke: BAD, fill: `${BAD}aa`, paths: bars, points: { show: false } },
      ],
    },
    [x, calls, failed],
  );
}

function durationChart(box, stats) {
  const x = stats.buckets.map((b) => seconds(b.start));
  return plot(
    box,
    {
      legend: { show: true, live: false },
      cursor: { show: false },
      scales: { x: { time: true } },
      axes: [{}, { label: "ms", size: 56 }],
      series: [
        {},
        // Points too: a bucket between two empty ones has no line to draw.
        { label: "p50", stroke: P50, width: 2, points: { show: true, size: 6, fill: P50 } },
        { label: "p99", stroke: P99, width: 2, dash: [6, 4], points: { show: true, size: 6, fill: P99 } },
      ],
    },
    [x, stats.buckets.map((b) => b.p50_ms), stats.buckets.map((b) => b.p99_ms)],
  );
}

function bucketTable(stats) {
  const busy = stats.buckets.filter((b) => b.calls > 0);
  if (!busy.length) return h("p", { class: "empty", text: "No calls in this window." });
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { class: "stats-table" },
      h("caption", { text: `Buckets with calls (${stats.bucket_seconds / 60} min each)` }),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ["Start", "Calls", "Failures", "p50", "p99"].map((c) => h("th", { scope: "col", text: c })),
        ),
      ),
      h(
        "tbody",
        {},
        busy.map((b) =>
          h(
            "tr",
            {},
            h("td", { text: new Date(b.start).toLocaleString() }),
            h("td", { class: "num", text: String(b.calls) }),
            h(
              "td",
              {},
              b.failures
                ? Object.entries(b.failures_by_code)
                    .map(([code, n]) => `${n} ${code}`)
                    .join(", ")
                : "0",
            ),
            h("td", { class: "num", text: ms(b.p50_ms) }),
            h("td", { class: "num", text: ms(b.p99_ms) }),
          ),
        ),
      ),
    ),
  );
}

// The tool page's section: a window picker, the two charts, their summary and table.
export function statsSection(tool) {
  let window = "24h";
  let undraw = [];
  const headingId = uid("stats-h");
  // Not a status role: the page's one status line is its own (tool.js).
  const summary = h("p", { class: "stats-summary", "aria-live": "polite" });
  const calls = h("div", { class: "chart", role: "img" });
  const durations = h("div", { class: "chart", role: "img" });
  const table = h("details", { class: "stats-details" });
  const alert = h("p", { class: "form-alert", role: "alert" });
  const picker = h(
    "div",
    { class: "window-picker", role: "group", "aria-label": "Window" },
    WINDOWS.map((w) =>
      h("button", {
        type: "button",
        "data-window": w,
        "aria-pressed": String(w === window),
        onclick: () => {
          window = w;
          for (const b of picker.querySelectorAll("button"))
            b.setAttribute("aria-pressed", String(b.dataset.window === w));
          refresh();
        },
        text: w,
      }),
    ),
  );
  const refresh = async () => {
    try {
      const stats = await readStats(tool.id, window);
      alert.textContent = "";
      for (const stop of undraw) stop();
      const text = summaryText(stats);
      summary.textContent = text;
      calls.setAttribute("aria-label", `Calls and failures per bucket: ${text}`);
      durations.setAttribute("aria-label", `p50 and p99 duration per bucket: ${text}`);
      clear(calls);
      clear(durations);
      undraw = [callsChart(calls, stats), durationChart(durations, stats)];
      clear(table, h("summary", { text: "The same as a table" }), bucketTable(stats));
    } catch (err) {
      alert.textContent = err.message;
    }
  };
  refresh();
  const element = section(
    headingId,
    "Calls over time",
    picker,
    summary,
    alert,
    h("h3", { text: "Calls and failures" }),
    calls,
    h("h3", { text: "Duration (p50, p99)" }),
    durations,
    table,
  );
  element.classList.add("stats");
  return { element, refresh };
}

// A list row's activity: the calls of the last 24 hours per 15 minutes, failures in red.
export function activityChart(box, stats) {
  const x = stats.buckets.map((b) => seconds(b.start));
  box.setAttribute("aria-label", summaryText(stats));
  clear(box);
  return plot(
    box,
    {
      height: 32,
      legend: { show: false },
      cursor: { show: false },
      select: { show: false },
      scales: { x: { time: false }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
      axes: [{ show: false }, { show: false }],
      series: [
        {},
        { stroke: OK, fill: `${OK}55`, paths: bars, points: { show: false } },
        { stroke: BAD, fill: `${BAD}aa`, paths: bars, points: { show: false } },
      ],
    },
    [x, stats.buckets.map((b) => b.calls), stats.buckets.map((b) => b.failures)],
    96,
  );
}
