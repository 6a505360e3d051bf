// The one way the view talks to the service: bearer token from this tab, JSON in and out,
// the contract's error envelope turned into an ApiError. No cookies: the browser never sends
// a credential by itself, so no other site can make requests in the user's name (no CSRF).

const KEY = "toolkiln.token";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

let token = sessionStorage.getItem(KEY);
const listeners = [];

export const session = {
  get token() {
    return token;
  },
  signIn(value) {
    token = value;
    sessionStorage.setItem(KEY, value);
  },
  signOut() {
    token = null;
    sessionStorage.removeItem(KEY);
    for (const fn of listeners) fn();
  },
  onSignOut(fn) {
    listeners.push(fn);
  },
};

export async function api(method, path, body, { signal, accept } = {}) {
  const headers = { Accept: accept || "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
      signal,
    });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new ApiError(0, "network", "The service could not be reached.", null);
  }
  if (accept === "text/event-stream" && res.ok) return res;
  if (res.status === 204) return null;
  let payload = null;
  try {
    payload = await res.json();
  } catch {
    payload = null;
  }
  if (!res.ok) {
    const e = payload?.error || {};
    const error = new ApiError(
      res.status,
      typeof e.code === "string" ? e.code : "http_error",
      typeof e.message === "string" ? e.message : `The service answered ${res.status}.`,
      e.details ?? null,
    );
    if (res.status === 401 && token) session.signOut();
    throw error;
  }
  return payload;
}

// Every page of a list, up to a bound (the view shows at most this many rows).
export async function all(path, { max = 1000 } = {}) {
  const out = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api("GET", cursor ? `${path}${sep}cursor=${encodeURIComponent(cursor)}` : path);
    out.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor && out.length < max);
  return out;
}

export const q = encodeURIComponent;
