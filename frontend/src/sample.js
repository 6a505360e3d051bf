// The Input a test run starts from, made from the tool's JSON Schema: an example of the whole
// input when the schema gives one, else each property's example, default, const or first enum
// value. A required property with none of those gets an empty value of its type (an object's
// own properties filled the same way); an optional one is left out, so the tool's own default
// applies instead of an empty string standing in for it.

const DEPTH = 6; // nested objects are filled this deep at most

function first(list) {
  return Array.isArray(list) && list.length ? list[0] : undefined;
}

function isObject(v) {
  return Boolean(v) && typeof v === "object" && !Array.isArray(v);
}

function given(spec) {
  if (!isObject(spec)) return undefined;
  for (const v of [first(spec.examples), spec.example, spec.default, spec.const, first(spec.enum)]) {
    if (v !== undefined) return v;
  }
  return undefined;
}

function typeOf(spec) {
  const t = Array.isArray(spec.type) ? spec.type.find((x) => x !== "null") : spec.type;
  return t || (isObject(spec.properties) ? "object" : undefined);
}

function empty(spec, depth) {
  if (!isObject(spec)) return null;
  switch (typeOf(spec)) {
    case "string":
      return "";
    case "number":
    case "integer":
      return typeof spec.minimum === "number" ? spec.minimum : 0;
    case "boolean":
      return false;
    case "array":
      return [];
    case "object":
      return depth < DEPTH ? fill(spec, depth + 1) : {};
    default:
      return null;
  }
}

function fill(schema, depth) {
  const props = isObject(schema.properties) ? schema.properties : {};
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const out = {};
  for (const [key, spec] of Object.entries(props)) {
    const value = given(spec);
    if (value !== undefined) out[key] = value;
    else if (required.has(key)) out[key] = empty(spec, depth);
  }
  return out;
}

export function sampleInput(schema) {
  if (!isObject(schema)) return {};
  const whole = given(schema);
  return isObject(whole) ? whole : fill(schema, 0);
}
