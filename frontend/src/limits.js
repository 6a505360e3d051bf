// What the service allows, asked of the service: each language's timeout (its default and
// ceiling, GET /v1/custom-tools/runtimes), the workspace's own ceiling (max_timeout_ms of its
// policy), and the caps the API document states for a tool's fields and for a page of a list
// (GET /openapi.json, made from the models that enforce them). The view holds no number of its
// own: a part that cannot be read is left out (no hint, no bound), and the API still refuses
// what breaks a rule, naming the field.

import { api, q, session } from "./api.js";

let service = null; // the runtimes and the API document: the same for every workspace

session.onSignOut(() => {
  service = null;
});

// A number the schema states under `key`, at its top or in one branch of an anyOf
// (FastAPI writes an optional field as anyOf [{...}, {type: null}]).
function stated(schema, key) {
  if (!schema || typeof schema !== "object") return undefined;
  if (typeof schema[key] === "number") return schema[key];
  for (const branch of Array.isArray(schema.anyOf) ? schema.anyOf : []) {
    if (typeof branch?.[key] === "number") return branch[key];
  }
  return undefined;
}

function fieldsOf(doc, model) {
  return doc?.components?.schemas?.[model]?.properties || {};
}

function pageSizeOf(doc) {
  const params = doc?.paths?.["/v1/custom-tools"]?.get?.parameters;
  const limit = Array.isArray(params) ? params.find((p) => p?.name === "limit") : null;
  return stated(limit?.schema, "maximum");
}

async function readService() {
  const quietly = (promise) => promise.catch(() => null);
  const [runtimes, doc] = await Promise.all([
    quietly(api("GET", "/v1/custom-tools/runtimes")),
    quietly(api("GET", "/openapi.json")),
  ]);
  const tool = fieldsOf(doc, "ToolCreate");
  const timeout = {};
  for (const [language, runtime] of Object.entries(runtimes?.data || {})) {
    const own = runtime?.limits?.timeout_ms || {};
    timeout[language] = {
      default: typeof own.default === "number" ? own.default : stated(tool.timeout_ms, "default"),
      min: stated(tool.timeout_ms, "minimum"),
      max: [own.max, stated(tool.timeout_ms, "maximum")].filter((n) => typeof n === "number"),
    };
  }
  return {
    timeout,
    nameChars: stated(tool.name, "maxLength"),
    messageChars: stated(tool.execution_message_description, "maxLength"),
    testCases: stated(tool.test_cases, "maxItems"),
    describeChars: stated(fieldsOf(doc, "GenerateIn").description, "maxLength"),
    pageSize: pageSizeOf(doc),
  };
}

// What holds for every workspace (the runtimes and the API document), read once a sign-in.
export function serviceLimits() {
  service ??= readService();
  return service;
}

// The limits for a tool of this workspace. Timeouts are per language and held to the
// workspace's ceiling: {default, min, max}, each undefined when it could not be read.
export async function limitsFor(workspaceId) {
  const [base, policy] = await Promise.all([
    serviceLimits(),
    api("GET", `/v1/workspaces/${q(workspaceId)}/policy`).catch(() => null),
  ]);
  const ceiling = policy?.data?.max_timeout_ms;
  const timeout = {};
  for (const [language, t] of Object.entries(base.timeout)) {
    const bounds = typeof ceiling === "number" ? [...t.max, ceiling] : t.max;
    const max = bounds.length ? Math.min(...bounds) : undefined;
    const start = typeof t.default === "number" && typeof max === "number" ? Math.min(t.default, max) : t.default;
    timeout[language] = { default: start, min: t.min, max };
  }
  return { ...base, timeout };
}

// The path asking for the API's largest page, when that is known (else the API's default).
export function paged(path, limits) {
  if (typeof limits?.pageSize !== "number") return path;
  return `${path}${path.includes("?") ? "&" : "?"}limit=${limits.pageSize}`;
}
