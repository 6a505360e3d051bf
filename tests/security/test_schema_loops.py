"""A tool's input schema cannot make the service recurse without end.

A ``$ref`` that leads back to where it started through keywords that apply to the value itself
(``$ref``, ``allOf``/``anyOf``/``oneOf``, ``not``, ``if``/``then``/``else``,
``dependentSchemas``) never reaches a part of the value: jsonschema recursed until Python's
limit on every input (the API answered 400 "the request body is nested too deeply"), and
jsonschema-rs guessed "valid". Attack: save, update and test such schemas, in several shapes
(directly, through a chain of ``$defs``, a pointer into ``properties``, an ``$id`` scope), and
invoke a tool whose schema was stored before saving refused them. Each is refused naming the
``$ref`` that closes the loop; recursive schemas that do move into the value still work. The
same class, without a loop: a schema that applies 2**n subschemas to one value in place, and
references by anchor that crawled the whole schema again for each (quadratic per input), and
a recursive schema whose work doubles at each level of the value (cut off by a step budget).
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa

from tests.security.conftest import Target
from tests.security.tenants import tenant
from toolkiln.domain.schema.parameters import DIALECT
from toolkiln.storage import tables

LOOPS: list[tuple[dict[str, Any], str]] = [
    ({"type": "object", "$ref": "#"}, "input_schema.$ref"),
    ({"type": "object", "allOf": [{"$ref": "#"}]}, "input_schema.allOf.0.$ref"),
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/a"}},
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
        },
        "input_schema.$defs.b.anyOf.0.$ref",
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/n"}},
            "$defs": {"n": {"not": {"$ref": "#/$defs/n"}}},
        },
        "input_schema.$defs.n.not.$ref",
    ),
    (
        {"type": "object", "$ref": "#/properties/x", "properties": {"x": {"$ref": "#"}}},
        "input_schema.properties.x.$ref",
    ),
    ({"type": "object", "if": {"$ref": "#"}, "then": {}}, "input_schema.if.$ref"),
    (
        {"type": "object", "dependentSchemas": {"a": {"$ref": "#"}}},
        "input_schema.dependentSchemas.a.$ref",
    ),
    (
        {
            "type": "object",
            "properties": {"x": {"$ref": "https://example.com/a"}},
            "$defs": {"a": {"$id": "https://example.com/a", "oneOf": [{"$ref": "#"}]}},
        },
        "input_schema.$defs.a.oneOf.0.$ref",
    ),
]

CODE = "def main(**params):\n    return {'message': 'ran'}\n"


def _draft(target: Target, schema: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {
        "workspace_id": target.workspace_id,
        "name": "looping-schema",
        "language": "python",
        "code": CODE,
        "input_schema": schema,
        **over,
    }


def _refused(r: Any, field: str) -> None:
    assert r.status_code == 422, r.text
    problem = r.json()["error"]["details"][0]
    assert problem["field"] == field, problem
    assert "never ends" in problem["message"]


@pytest.mark.parametrize(("schema", "field"), LOOPS)
def test_a_looping_schema_is_refused_on_save_update_and_test(
    target: Target, schema: dict[str, Any], field: str
) -> None:
    c, h = target.client, target.headers
    _refused(c.post("/v1/custom-tools", json=_draft(target, schema), headers=h), field)
    saved = c.post(
        "/v1/custom-tools", json=_draft(target, {"type": "object"}, name="plain"), headers=h
    )
    assert saved.status_code == 201, saved.text
    tool_id = saved.json()["data"]["id"]
    try:
        r = c.patch(f"/v1/custom-tools/{tool_id}", json={"input_schema": schema}, headers=h)
        _refused(r, field)
        tested = c.post(
            "/v1/custom-tools/test", json=_draft(target, schema, input={"a": 1}), headers=h
        )
        _refused(tested, field)
    finally:
        c.delete(f"/v1/custom-tools/{tool_id}", headers=h)


def test_a_looping_schema_stored_before_refuses_every_input(target: Target) -> None:
    t = tenant(target.runtime, target.client, "schema-loops")
    tool_id = t.tool("stored-loop", CODE, language="python")
    looping = {"type": "object", "allOf": [{"$ref": "#"}]}
    with target.runtime.database.engine.begin() as conn:  # as an older version saved it
        conn.execute(
            sa.update(tables.tools).where(tables.tools.c.id == tool_id).values(input_schema=looping)
        )
        conn.execute(
            sa.update(tables.tool_versions)
            .where(tables.tool_versions.c.tool_id == tool_id)
            .values(input_schema=looping)
        )
    for payload in ({}, {"a": 1}):
        refused = t.invoke(tool_id, payload)
        assert refused["status"] == "error", refused
        assert refused["error"]["code"] == "invalid_input", refused
        assert "never ends" in refused["error"]["details"][0]["message"]


RECURSIVE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
        "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]},
    },
    "$defs": {"node": {"allOf": [{"$ref": "#"}], "required": ["name"]}},
    "additionalProperties": False,
}


def _tree(depth: int, leaf: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"name": leaf}
    for _ in range(depth):
        node = {"name": "n", "children": [node], "next": None}
    return node


def test_recursive_schemas_that_move_into_the_value_still_work(target: Target) -> None:
    t = tenant(target.runtime, target.client, "schema-recursive")
    tool_id = t.tool("tree", CODE, language="python", input_schema=RECURSIVE)
    assert t.invoke(tool_id, _tree(20, "leaf"))["status"] == "ok"
    assert t.invoke(tool_id, {"name": "a", "next": {"name": "b", "next": None}})["status"] == "ok"
    bad = t.invoke(tool_id, _tree(3, 5))
    assert bad["error"]["code"] == "invalid_input", bad
    field = bad["error"]["details"][0]["field"]
    assert field == "input.children.0.children.0.children.0.name", field
    missing = t.invoke(tool_id, {"name": "a", "next": {"next": None}})
    assert missing["error"]["code"] == "invalid_input", missing
    assert missing["error"]["details"][0]["field"] == "input.next", missing  # anyOf: none fits


def test_a_loop_in_a_definition_nothing_uses_is_not_refused(target: Target) -> None:
    unused = {"type": "object", "$defs": {"n": {"not": {"$ref": "#/$defs/n"}}}}
    r = target.client.post(
        "/v1/custom-tools", json=_draft(target, unused, name="unused-loop"), headers=target.headers
    )
    assert r.status_code == 201, r.text
    t = tenant(target.runtime, target.client, "schema-unused-loop")
    tool_id = t.tool("unused", CODE, language="python", input_schema=unused)
    assert t.invoke(tool_id, {"a": 1})["status"] == "ok"


@pytest.mark.parametrize(("schema", "field"), LOOPS)
def test_each_refused_shape_really_never_ends(schema: dict[str, Any], field: str) -> None:
    """Refused for a reason: jsonschema itself recurses until Python's limit on them."""
    from jsonschema import Draft202012Validator

    from toolkiln.domain.schema.references import _NO_RETRIEVAL

    value = {"a": 1, "x": 1}
    with pytest.raises(BaseException) as raised:
        list(Draft202012Validator(schema, registry=_NO_RETRIEVAL).iter_errors(value))
    # Python's limit, or the same in referencing's Rust maps (rpds), as a pyo3 panic
    assert isinstance(raised.value, RecursionError) or "RecursionError" in str(raised.value)


def test_then_and_else_count_only_beside_an_if_that_can_take_them(target: Target) -> None:
    c, h = target.client, target.headers
    for i, schema in enumerate(
        [
            {"type": "object", "then": {"$ref": "#"}},  # no if: never applied
            {"type": "object", "if": False, "then": {"$ref": "#"}},  # never taken
            {"type": "object", "if": True, "else": {"$ref": "#"}},
        ]
    ):
        r = c.post("/v1/custom-tools", json=_draft(target, schema, name=f"branch-{i}"), headers=h)
        assert r.status_code == 201, (schema, r.text)
        c.delete(f"/v1/custom-tools/{r.json()['data']['id']}", headers=h)
    taken = {"type": "object", "if": True, "then": {"$ref": "#"}}
    _refused(
        c.post("/v1/custom-tools", json=_draft(target, taken), headers=h), "input_schema.then.$ref"
    )


def _fan_out(levels: int) -> dict[str, Any]:
    """Each definition applies the next one twice, to the same value: 2**levels in all."""
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "object"}
    return {"type": "object", "$ref": "#/$defs/d0", "$defs": defs}


def test_a_schema_that_applies_too_many_subschemas_to_one_value_is_refused(
    target: Target,
) -> None:
    c, h = target.client, target.headers
    r = c.post("/v1/custom-tools", json=_draft(target, _fan_out(18)), headers=h)
    assert r.status_code == 422, r.text
    problem = r.json()["error"]["details"][0]
    assert problem["field"].startswith("input_schema.$defs.d"), problem
    assert "more than 10000 subschemas" in problem["message"]
    fine = c.post("/v1/custom-tools", json=_draft(target, _fan_out(8), name="fan-8"), headers=h)
    assert fine.status_code == 201, fine.text  # 256: a repeated definition is not a fault
    c.delete(f"/v1/custom-tools/{fine.json()['data']['id']}", headers=h)


def test_an_id_that_is_no_uri_is_refused_not_a_500(target: Target) -> None:
    schema = {
        "type": "object",
        "$id": "https://example.com/root",
        "properties": {"a": {"$id": "http://[::1", "$ref": "#/$defs/b"}},
        "$defs": {"b": {"type": "string"}},
    }
    r = target.client.post("/v1/custom-tools", json=_draft(target, schema), headers=target.headers)
    assert r.status_code == 422, r.text
    assert "not a URI" in r.json()["error"]["details"][0]["message"]
    # Without any $ref too: saved, it refused every input (until 2026-12-06).
    plain = {"type": "object", "$id": "http://[::1", "properties": {}}
    r = target.client.post("/v1/custom-tools", json=_draft(target, plain), headers=target.headers)
    assert r.status_code == 422, r.text
    assert "not a URI" in r.json()["error"]["details"][0]["message"]


def test_references_by_anchor_resolve_without_crawling_the_schema_again(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncrawled registry crawled the whole schema again for every anchor a value met:
    880 of them in a 64 KB schema cost 6.6 s of CPU per invalid input. The schema is crawled
    once when its validator is made, never per value."""
    import referencing

    n = 300
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"$ref": f"#a{i}"} for i in range(n)},
        "$defs": {f"d{i}": {"$anchor": f"a{i}", "type": "string"} for i in range(n)},
    }
    t = tenant(target.runtime, target.client, "schema-anchors")
    tool_id = t.tool("anchors", CODE, language="python", input_schema=schema)
    assert t.invoke(tool_id, {"p0": "x"})["status"] == "ok"  # the validator is made (cached)
    crawls = []
    real = referencing.Registry.crawl
    monkeypatch.setattr(referencing.Registry, "crawl", lambda self: crawls.append(1) or real(self))
    value: dict[str, Any] = {f"p{i}": "x" for i in range(n)}
    value["p7"] = 7
    refused = t.invoke(tool_id, value)
    assert refused["error"]["details"][0]["field"] == "input.p7", refused
    assert t.invoke(tool_id, {f"p{i}": "x" for i in range(n)})["status"] == "ok"
    assert len(crawls) <= 2, len(crawls)


DOUBLING = {  # each level of the value meets the whole schema twice: 2**depth evaluations
    "type": "object",
    "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}],
    "$defs": {"a": {"properties": {"x": {"$ref": "#"}}}},
}


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"x": value}
    return value


def test_a_schema_whose_work_doubles_at_each_level_of_the_value_is_cut_off(target: Target) -> None:
    """Saved (nothing loops, and per value it applies few subschemas), but the work grows as
    2**depth of the value: values may nest 64 deep. jsonschema counts its steps and stops;
    jsonschema-rs, which has no budget, is not used for a recursive schema."""
    t = tenant(target.runtime, target.client, "schema-doubling")
    tool_id = t.tool("doubling", CODE, language="python", input_schema=DOUBLING)
    assert t.invoke(tool_id, _nested(3, {}))["status"] == "ok"
    wrong = t.invoke(tool_id, _nested(3, 1))
    assert wrong["error"]["details"][0]["field"] == "input.x.x.x", wrong  # its own error
    cut = t.invoke(tool_id, _nested(40, {}))  # valid: 2**40 steps to say so, never taken
    assert cut["error"]["code"] == "invalid_input", cut
    assert "took more steps" in cut["error"]["details"][0]["message"], cut
    wrong = t.invoke(tool_id, _nested(40, 1))  # its first errors are found, then it stops
    assert wrong["error"]["code"] == "invalid_input", wrong
    with_dialect = t.tool(
        "doubling-dialect", CODE, language="python", input_schema={**DOUBLING, "$schema": DIALECT}
    )
    cut = t.invoke(with_dialect, _nested(40, {}))  # the root's $schema changes nothing
    assert "took more steps" in cut["error"]["details"][0]["message"], cut


def test_a_large_value_gets_its_own_errors_within_its_budget(target: Target) -> None:
    schema = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {"$ref": "#/$defs/row"},
            }
        },
        "$defs": {"row": {"properties": {f"k{j}": {"minimum": 0} for j in range(10)}}},
    }
    t = tenant(target.runtime, target.client, "schema-large-value")
    tool_id = t.tool("rows", CODE, language="python", input_schema=schema)
    bad = t.invoke(tool_id, {"rows": [{f"k{j}": -1 for j in range(10)} for _ in range(2000)]})
    assert bad["error"]["details"][0]["field"] == "input.rows.0.k0", bad


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        (
            {"type": "object", "properties": {"a": {"$schema": DIALECT, "type": "string"}}},
            "input_schema.properties.a.$schema",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/properties/b/enum/0"}, "b": {"enum": [1]}},
            },
            "input_schema.properties.a.$ref",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/allOf"}}, "allOf": [{}]},
            "input_schema.properties.a.$ref",
        ),
    ],
)
def test_a_dialect_below_the_root_or_a_ref_to_a_non_schema_is_refused(
    target: Target, schema: dict[str, Any], field: str
) -> None:
    r = target.client.post("/v1/custom-tools", json=_draft(target, schema), headers=target.headers)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == field, r.text


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
            "input_schema.properties.a.$ref",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/b"}},
                "$defs": {"b": {"items": {"$ref": "#nowhere"}}},
            },
            "input_schema.$defs.b.items.$ref",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "https://example.com/s#/$defs/gone"}},
                "$defs": {"s": {"$id": "https://example.com/s", "type": "string"}},
            },
            "input_schema.properties.a.$ref",
        ),
    ],
)
def test_a_ref_to_a_place_the_schema_does_not_have_is_refused_on_save(
    target: Target, schema: dict[str, Any], field: str
) -> None:
    """A ``$ref`` to a pointer or an anchor the schema lacks was saved; every value reaching
    it was then refused ("... which is never fetched", though nothing was to be fetched), and
    the tool lists offered model providers a schema with a dangling reference, which they
    refuse. A reference outside the schema is still saved (never fetched, per input)."""
    c, h = target.client, target.headers
    name = f"dangling-{secrets.token_hex(3)}"
    r = c.post("/v1/custom-tools", json=_draft(target, schema, name=name), headers=h)
    assert r.status_code == 422, r.text
    problem = r.json()["error"]["details"][0]
    assert problem["field"] == field, problem
    assert "does not have" in problem["message"], problem
    tested = c.post("/v1/custom-tools/test", json=_draft(target, schema, input={}), headers=h)
    assert tested.status_code == 422, tested.text
    outside = {"type": "object", "properties": {"a": {"$ref": "https://example.com/other"}}}
    saved = c.post("/v1/custom-tools", json=_draft(target, outside, name=f"{name}-o"), headers=h)
    assert saved.status_code == 201, saved.text
    c.delete(f"/v1/custom-tools/{saved.json()['data']['id']}", headers=h)


def test_a_dangling_ref_stored_before_still_takes_values_that_do_not_reach_it(
    target: Target,
) -> None:
    t = tenant(target.runtime, target.client, "schema-dangling")
    tool_id = t.tool("plain", CODE, language="python")
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}
    with target.runtime.database.engine.begin() as conn:  # as an older version saved it
        conn.execute(
            sa.update(tables.tools).where(tables.tools.c.id == tool_id).values(input_schema=schema)
        )
        conn.execute(
            sa.update(tables.tool_versions)
            .where(tables.tool_versions.c.tool_id == tool_id)
            .values(input_schema=schema)
        )
    assert t.invoke(tool_id, {})["status"] == "ok"
    refused = t.invoke(tool_id, {"a": 1})
    assert refused["error"]["code"] == "invalid_input", refused


def test_keywords_whose_own_work_grows_with_the_value_are_charged(target: Target) -> None:
    """uniqueItems compares objects pairwise (4000 of them: 16 s); it is charged before it runs."""
    schema = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True}}}
    t = tenant(target.runtime, target.client, "schema-unique")
    tool_id = t.tool("unique", CODE, language="python", input_schema=schema)
    items = [{"k": i} for i in range(3000)] + [{"k": 0}]  # one repeat: jsonschema-rs says no
    cut = t.invoke(tool_id, {"u": items})
    assert "took more steps" in cut["error"]["details"][0]["message"], cut
    few = t.invoke(tool_id, {"u": [{"k": 1}, {"k": 1}]})
    assert "non-unique" in few["error"]["details"][0]["message"], few


def test_subschemas_without_keywords_of_their_own_are_charged_for_the_value_they_walk(
    target: Target,
) -> None:
    """`contains: true` in each of ~6000 subschemas applied to one array: each walks the whole
    array (16.8 s of CPU for 20,000 items) while evaluating no keyword below it."""
    defs: dict[str, Any] = {
        f"d{i}": {"contains": True, "allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(11)
    }
    defs["d11"] = {"contains": True}
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}
    t = tenant(target.runtime, target.client, "schema-walks")
    tool_id = t.tool("walks", CODE, language="python", input_schema=schema)
    cut = t.invoke(tool_id, {"a": list(range(20_000))})
    assert "took more steps" in cut["error"]["details"][0]["message"], cut
    assert t.invoke(tool_id, {"a": [1]})["status"] == "ok"


def test_a_ref_to_a_bundled_metaschema_is_never_resolved(target: Target) -> None:
    """jsonschema's default registry holds its metaschemas: one named by a $ref was applied
    (as 2020-12) and failed on the value with a TypeError, a 500."""
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": "http://json-schema.org/draft-04/schema#"}},
    }
    t = tenant(target.runtime, target.client, "schema-metaschema")
    tool_id = t.tool("meta", CODE, language="python", input_schema=schema)
    refused = t.invoke(tool_id, {"x": {"type": [5]}})
    assert refused["error"]["code"] == "invalid_input", refused
    assert "never fetched" in refused["error"]["details"][0]["message"], refused


def test_a_value_too_large_for_its_schemas_enums_is_judged_within_its_budget(
    target: Target,
) -> None:
    """Each part of a value may be compared with each enum and const value: jsonschema-rs
    does that holding the interpreter, without a budget, and 60,000 items against 1,500
    enum objects held every request of the service for 13 s (until 2026-12-06). Such a
    value goes to jsonschema, which charges each comparison to the value's budget: refused
    within it. A property named ``default`` hides no enum from the count (found by review),
    and a large value whose parts meet few enum values is still checked and taken."""
    t = tenant(target.runtime, target.client, "schema-enum-work")
    objects = {"type": "array", "items": {"enum": [{"a": n} for n in range(1500)]}}
    for prop in ("x", "default", "examples"):
        schema = {"type": "object", "properties": {prop: objects}}
        tool_id = t.tool(f"enum-work-{prop}", CODE, language="python", input_schema=schema)
        assert t.invoke(tool_id, {prop: [{"a": 1499}] * 100})["status"] == "ok"
        wrong = t.invoke(tool_id, {prop: [{"a": 1500}]})
        assert wrong["error"]["details"][0]["field"] == f"input.{prop}.0", wrong
        big = t.invoke(tool_id, {prop: [{"a": 1499}] * 60_000})
        assert big["error"]["code"] == "invalid_input", big
        assert "took more steps" in big["error"]["details"][0]["message"], big
    few = {
        "type": "object",
        "properties": {
            "op": {"enum": [f"op{n}" for n in range(10)]},
            "values": {"type": "array", "items": {"type": "number"}},
        },
    }
    tool_id = t.tool("enum-few", CODE, language="python", input_schema=few)
    assert t.invoke(tool_id, {"op": "op1", "values": [1.5] * 150_000})["status"] == "ok"
