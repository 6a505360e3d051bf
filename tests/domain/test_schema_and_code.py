"""Pure rules: parameters <-> JSON Schema, static code checks, names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toolkiln.domain.code_check import analyse
from toolkiln.domain.schema.parameters import parameters_to_schema, schema_to_parameters
from toolkiln.domain.schema.saving import check_schema
from toolkiln.domain.tools import check_name

param_specs = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "number", "integer", "boolean", "array", "object"])},
    optional={
        "description": st.text(
            st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=20
        ),
        "required": st.booleans(),
    },
)


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), param_specs, max_size=6))
def test_parameters_round_trip_through_json_schema(params: dict) -> None:
    schema, problems = parameters_to_schema(params)
    assert problems == [] and check_schema(schema, searcher=None) == []
    back = schema_to_parameters(schema)
    expected = {k: {**v, "required": v.get("required", False)} for k, v in params.items()}
    assert back == expected


def test_schemas_beyond_the_parameters_form_have_no_parameters_view() -> None:
    assert schema_to_parameters({"type": "object", "oneOf": [{}]}) is None
    assert schema_to_parameters({"type": "object", "properties": {}}) == {}
    # Required without a property: {} would hide that a value must be given.
    needs_b = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}
    assert schema_to_parameters(needs_b) is None


def test_python_entrypoints() -> None:
    assert analyse("python", "async def handle(input, ctx):\n    return 1\n").problems == ()
    assert analyse("python", "def main(**p):\n    return {}\n").entrypoint == "main"
    assert analyse("python", "async def handle(i, c):\n    return {}\n").entrypoint == "handle"
    assert analyse("python", "class main:\n    pass\n").problems[0]["field"] == "code"
    deep = "x = " + "(" * 5000 + "1" + ")" * 5000 + "\ndef main(**p):\n    return x\n"
    assert analyse("python", deep).problems[0]["field"] == "code"
    # Past the parser's nesting limit CPython raises MemoryError: a problem of the code here.
    unary = "x = " + "-" * 20000 + "1\ndef main(**p):\n    return x\n"
    assert "nests too deeply" in analyse("python", unary).problems[0]["message"]


def test_javascript_entrypoints() -> None:
    found = analyse("javascript", "export function main(p, ctx) { return {message: 'x'} }")
    assert found.problems == () and found.script.startswith("       function main")
    assert analyse("javascript", "async function handle(i, c) { return 1 }").entrypoint == "handle"
    assert analyse("javascript", "function main(p) { return [1,2,,] }").problems == ()


def test_javascript_imports_become_requires_on_their_own_lines() -> None:
    code = (
        "import _ from 'lodash';\nimport * as z from 'zod'\n"
        "import dayjs, { a as b, c } from 'dayjs';\nimport 'side';\n"
        "export async function handle(i, c) {\n"
        "  const y = require('other'); if (i) { require('deep') }\n  return require(`t`) }\n"
    )
    found = analyse("javascript", code)
    assert found.script.splitlines()[:4] == [
        "const _ = __tk_default(require('lodash'));",
        "const z = require('zod');",
        "const dayjs = __tk_default(require('dayjs')); const { a: b, c } = require('dayjs');",
        "require('side');",
    ]
    assert sorted(found.imports) == ["dayjs", "deep", "lodash", "other", "side", "zod"]


def test_names() -> None:
    assert check_name("lookup-order-status") == []
    for bad in ["", "-a", "a-", "a--b", "A", "a_b", "a b", "é", "a" * 65, "a\n"]:
        assert check_name(bad), bad


def test_a_missing_required_property_is_named_in_the_field() -> None:
    from toolkiln.domain.schema.validation import compile_validator, input_problems

    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}, "required": ["deep"]}},
        "required": ["order_id", "a"],
    }
    fields = [p["field"] for p in input_problems(compile_validator(schema, None), {"a": {}})]
    assert fields == ["input.order_id", "input.a.deep"]
