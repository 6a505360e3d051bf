// The Custom Tools view: sign-in, the workspace, and a hash router over the pages. The token
// lives in this tab's sessionStorage only; it is sent as a bearer header, never in a URL.

import { agentsPage } from "./agents.js";
import { ApiError, api, session } from "./api.js";
import { clear, field, h } from "./dom.js";
import { listPage } from "./list.js";
import { secretsPage } from "./secrets.js";
import { toolPage } from "./tool.js";

const WS_KEY = "toolkiln.workspace";
const main = document.getElementById("main");
const nav = document.getElementById("nav");

let stop = () => {};
let flash = null;
const ctx = {
  workspaceId: null,
  workspaces: [],
  navigate(hash) {
    if (window.location.hash === hash) route();
    else window.location.hash = hash;
  },
  flash(text) {
    flash = text;
  },
  takeFlash() {
    const text = flash;
    flash = null;
    return text;
  },
};

function signInPage(message) {
  stop();
  stop = () => {};
  clear(nav);
  // A text field (role textbox) whose characters are masked: not type=password, so browsers do
  // not offer to store the token, and it is found as a textbox named "Token".
  const input = h("input", {
    type: "text",
    class: "secret",
    autocomplete: "off",
    autocapitalize: "off",
    spellcheck: "false",
    required: true,
  });
  const alert = h("p", { class: "form-alert", role: "alert", text: message || "" });
  const button = h("button", { type: "submit", class: "primary", text: "Sign in" });
  const form = h(
    "form",
    { class: "card signin", "aria-label": "Sign in", novalidate: true },
    h("h1", { text: "Sign in" }),
    h("p", { text: "Paste an API token. It is kept for this tab only and sent as a bearer header." }),
    field("Token", input, { name: "token" }),
    h("div", { class: "actions" }, button),
    alert,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    alert.textContent = "";
    const value = input.value.trim();
    if (!value) {
      alert.textContent = "Enter a token.";
      return;
    }
    session.signIn(value);
    try {
      await start();
      input.value = "";
    } catch (err) {
      if (session.token) session.signOut();
      signInPage(err instanceof ApiError ? err.message : String(err));
    }
  });
  clear(main, form);
  input.focus();
}

async function start() {
  const res = await api("GET", "/v1/workspaces");
  ctx.workspaces = res.data;
  if (!ctx.workspaces.length) throw new ApiError(403, "forbidden", "This token sees no workspace.", null);
  const kept = sessionStorage.getItem(WS_KEY);
  ctx.workspaceId = ctx.workspaces.some((w) => w.id === kept) ? kept : ctx.workspaces[0].id;
  drawNav();
  route();
}

function drawNav() {
  const picker = h(
    "select",
    {},
    ctx.workspaces.map((w) => h("option", { value: w.id, text: w.name })),
  );
  picker.value = ctx.workspaceId;
  picker.addEventListener("change", () => {
    ctx.workspaceId = picker.value;
    sessionStorage.setItem(WS_KEY, picker.value);
    ctx.navigate("#/");
  });
  clear(
    nav,
    h("a", { href: "#/", text: "Tools" }),
    h("a", { href: "#/agents", text: "Agents" }),
    h("a", { href: "#/secrets", text: "Secrets" }),
    ctx.workspaces.length > 1
      ? h("label", { class: "inline" }, "Workspace ", picker)
      : h("span", { class: "ws", text: ctx.workspaces[0].name }),
    h("button", { type: "button", class: "link", onclick: () => session.signOut(), text: "Sign out" }),
  );
}

function route() {
  if (!session.token) {
    signInPage();
    return;
  }
  stop();
  const hash = window.location.hash.replace(/^#/, "") || "/";
  // A part that is not valid percent-encoding (typed or pasted) is taken as it is: a URIError
  // here left the page half-torn-down, its polls stopped and nothing said.
  const decode = (part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return part;
    }
  };
  const parts = hash.split("/").filter(Boolean).map(decode);
  if (parts[0] === "tools" && parts[1]) stop = toolPage(main, ctx, { toolId: parts[1] });
  else if (parts[0] === "new")
    stop = toolPage(main, ctx, { language: parts[1] === "javascript" ? "javascript" : "python" });
  else if (parts[0] === "generate") stop = toolPage(main, ctx, { generate: true });
  else if (parts[0] === "agents") stop = agentsPage(main, ctx);
  else if (parts[0] === "secrets") stop = secretsPage(main, ctx);
  else stop = listPage(main, ctx);
  main.focus({ preventScroll: true });
}

session.onSignOut(() => signInPage("Signed out."));
window.addEventListener("hashchange", () => {
  if (session.token && ctx.workspaceId) route();
});

if (session.token) {
  start().catch((err) => {
    session.signOut();
    signInPage(err.message);
  });
} else signInPage();
