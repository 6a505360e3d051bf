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

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// A labelled control with a slot for the API's message about that field.
export function field(label, control, { name, hint } = {}) {
  const id = control.id || uid("f");
  control.id = id;
  const error = h("p", { class: "field-error", id: `${id}-error`, "aria-live": "polite" });
  const described = [error.id];
  let hintEl = null;
  if (hint) {
    hintEl = h("p", { class: "hint", id: `${id}-hint`, text: hint });
    described.push(hintEl.id);
  }
  control.setAttribute("aria-describedby", described.join(" "));
  const wrap = h("div", { class: "field" }, h("label", { for: id, text: label }), hintEl, control, error);
  if (name) wrap.dataset.field = name;
  return wrap;
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
