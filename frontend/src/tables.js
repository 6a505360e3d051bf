// A table that is one card per row on a narrow screen (app.css, table.cards): each cell names
// its column for the card (data-label), and explicit roles keep it a table for assistive
// technology when the narrow layout changes its display.

import { h } from "./dom.js";

export function cardTable(caption, columns, { className = "" } = {}) {
  const body = h("tbody", { role: "rowgroup" });
  const table = h(
    "table",
    { class: `cards ${className}`.trim(), role: "table" },
    h("caption", { text: caption }),
    h(
      "thead",
      { role: "rowgroup" },
      h(
        "tr",
        { role: "row" },
        columns.map((c) => h("th", { scope: "col", role: "columnheader", text: c })),
      ),
    ),
    body,
  );
  return { element: h("div", { class: "scroll" }, table), body };
}

export function row(props, ...cells) {
  return h("tr", { role: "row", ...props }, ...cells);
}

export function cell(label, props, ...children) {
  return h("td", { role: "cell", "data-label": label, ...props }, ...children);
}
