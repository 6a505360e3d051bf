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
  properties: { name: { type: "string", description: "Who to greet.", examples: ["Ada"] } },
};
