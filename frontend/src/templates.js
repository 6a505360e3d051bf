// Starting points for a new tool, one per language, in the shape of the code contract.

export const TEMPLATES = {
  python: [
    "def main(**params):",
    '    name = params.get("name", "world")',
    '    return {"message": f"Hello, {name}!", "rawData": {"name": name}}',
    "",
  ].join("\n"),
  javascript: [
    "async function main(params) {",
    '  const name = params.name ?? "world";',
    // biome-ignore lint/suspicious/noTemplateCurlyInString: this string is the template's JavaScript source
    "  return { message: `Hello, ${name}!`, rawData: { name } };",
    "}",
    "",
  ].join("\n"),
};

export const SCHEMA = {
  type: "object",
  properties: { name: { type: "string", description: "Who to greet." } },
};

// An Input to start from: each property of the schema with a value of its type.
export function sampleInput(schema) {
  const props = (schema && typeof schema === "object" && schema.properties) || {};
  const out = {};
  for (const [key, spec] of Object.entries(props)) {
    const type = spec && (Array.isArray(spec.type) ? spec.type[0] : spec.type);
    if (spec && spec.default !== undefined) out[key] = spec.default;
    else if (spec && Array.isArray(spec.enum) && spec.enum.length) out[key] = spec.enum[0];
    else if (type === "string") out[key] = "";
    else if (type === "number" || type === "integer") out[key] = 0;
    else if (type === "boolean") out[key] = false;
    else if (type === "array") out[key] = [];
    else if (type === "object") out[key] = {};
    else out[key] = null;
  }
  return out;
}
