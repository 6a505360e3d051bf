// A saved tool's status line (status and reason, version, uses, consecutive failures, last
// error) and its actions: Enable when disabled, else Disable, and Delete after the browser's
// confirmation.

import { ApiError, api, q } from "./api.js";
import { clear, h } from "./dom.js";

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
  if (tool.last_error) {
    parts.push(h("p", { class: "last-error" }, h("strong", { text: "Last error: " }), tool.last_error));
  }
  return parts;
}

export function toolStatus(page) {
  const line = h("div", { class: "tool-status" });
  const actions = h("div", { class: "actions" });
  const act = (fn) => async () => {
    page.fail("");
    try {
      await fn(page.tool);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      page.fail(err.message);
    }
  };
  const post = (verb, body, message) =>
    act(async (tool) =>
      page.setTool((await api("POST", `/v1/custom-tools/${q(tool.id)}/${verb}`, body)).data, message),
    );
  const remove = act(async (tool) => {
    if (!window.confirm(`Delete the tool ${tool.name}? Its versions go with it.`)) return;
    await api("DELETE", `/v1/custom-tools/${q(tool.id)}`);
    page.ctx.flash(`Deleted ${tool.name}.`);
    page.ctx.navigate("#/");
  });

  let drawn = null;
  const draw = (tool) => {
    clear(line, statusLine(tool));
    // The buttons are redrawn only when the status changes, so a poll never takes focus away.
    if (drawn === tool.status) return;
    drawn = tool.status;
    const buttons = [
      tool.status === "disabled"
        ? h("button", { type: "button", onclick: post("enable", undefined, "Enabled."), text: "Enable" })
        : h("button", { type: "button", onclick: post("disable", {}, "Disabled."), text: "Disable" }),
      h("button", { type: "button", class: "danger", onclick: remove, text: "Delete" }),
    ];
    const hadFocus = actions.contains(document.activeElement);
    clear(actions, buttons);
    if (hadFocus) buttons[0].focus(); // Enable became Disable (or back): keep the keyboard here
  };
  return { element: h("div", {}, line, actions), draw };
}
