// Building DOM nodes without HTML strings: every text goes in as a text node, so nothing a
// tool or another user wrote can become markup or script.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  put(el, children);
  return el;
}

export function put(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  return put(el, children);
}

// A titled section of a page: a card named by its heading (a landmark region of that name).
export function section(id, title, ...children) {
  return h("section", { class: "card", "aria-labelledby": id }, h("h2", { id, text: title }), ...children);
}

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// A labelled control with a slot for the API's message about that field; hint: text or a node.
export function field(label, control, { name, hint } = {}) {
  const id = control.id || uid("f");
  control.id = id;
  const error = h("p", { class: "field-error", id: `${id}-error`, "aria-live": "polite" });
  const described = [error.id];
  let hintEl = null;
  if (hint) {
    hintEl = h("p", { class: "hint", id: `${id}-hint` }, hint);
    described.push(hintEl.id);
  }
  control.setAttribute("aria-describedby", described.join(" "));
  const wrap = h("div", { class: "field" }, h("label", { for: id, text: label }), hintEl, control, error);
  if (name) wrap.dataset.field = name;
  return wrap;
}

// The page's status line: news in green, a summary of problems in the error colour.
export function say(el, text, { problem = false } = {}) {
  el.textContent = text || "";
  el.classList.toggle("is-problem", Boolean(text) && problem);
}

// An empty part of a Result or a row, said to be empty rather than drawn as an empty box.
export function none(props) {
  return h("span", { class: "none", text: "(none)", ...props });
}

export function pretty(value) {
  if (value === undefined) return "";
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}
