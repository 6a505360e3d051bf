"""A tool's input schema cannot make the service backtrack, or compile, for as long as a
caller likes.

A ``pattern`` is its tool author's regular expression, matched in the service against a
caller's text. Python's ``re`` backtracks without bound and holds the GIL while it does:
``^(a|a)*$`` against 27 characters took 4.8 s of CPU, during which the service answered nobody
in any workspace, and 40 characters would take hours; ``format: regex`` compiles a caller's
text, quadratic for a long ``x|x`` (22 s for 855 KB). Attack: every keyword of 2020-12 that
searches a schema's patterns (``pattern``, ``patternProperties``, ``additionalProperties`` and
``unevaluatedProperties`` beside them, ``propertyNames``), at the root, below a ``$ref`` and in
items, invoked over the API, as a test run and through ``ctx.tools``; ``format: regex`` text
made to compile slowly; counts ``re`` cannot hold. Each search runs in a process of its own
(sandbox/patterns.py) and the value is refused (``invalid_input``) once its searches have
taken their time; the service answers other callers meanwhile; patterns judge exactly as
``re`` does.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from types import FunctionType
from typing import Any

import pytest
import sqlalchemy as sa
from jsonschema import Draft202012Validator

from tests.security.conftest import Target
from tests.security.tenants import tenant
from toolkiln.domain.schema import budget
from toolkiln.domain.schema.budget import PATTERN_MESSAGE
from toolkiln.domain.schema.saving import check_schema
from toolkiln.domain.schema.validation import compile_validator, input_problems
from toolkiln.sandbox import patterns
from toolkiln.storage import tables

# 2**40 ways to split the text: no machine finishes it, with re or with regex.
EVIL = "^(a|a)*$"
TEXT = "a" * 40 + "!"
CODE = "def main(**params):\n    return {'message': 'ran'}\n"

# Each way a schema's patterns are searched, with an input that makes the search backtrack.
SHAPES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("pattern", {"properties": {"x": {"type": "string", "pattern": EVIL}}}, {"x": TEXT}),
    ("patternProperties", {"patternProperties": {EVIL: {"type": "integer"}}}, {TEXT: 1}),
    (
        "additionalProperties",
        {"patternProperties": {EVIL: {}}, "additionalProperties": False},
        {TEXT: 1},
    ),
    (
        "unevaluatedProperties",
        {"patternProperties": {EVIL: {}}, "unevaluatedProperties": False},
        {TEXT: 1},
    ),
    ("propertyNames", {"propertyNames": {"pattern": EVIL}}, {TEXT: 1}),
    (
        "below a $ref",
        {"properties": {"x": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"pattern": EVIL}}},
        {"x": TEXT},
    ),
    (
        "in items",
        {"properties": {"x": {"type": "array", "items": {"type": "string", "pattern": EVIL}}}},
        {"x": ["ok", TEXT]},
    ),
]


def _schema(extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", **extra}


def _draft(workspace_id: str, name: str, extra: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "name": name,
        "language": "python",
        "code": CODE,
        "input_schema": _schema(extra),
        **more,
    }


@pytest.fixture
def searcher() -> Any:
    """The service's searcher, for the tests that check values in this process."""
    yield patterns.shared()


def _refused_for_time(result: dict[str, Any]) -> None:
    assert result["status"] == "error", result
    assert result["error"]["code"] == "invalid_input", result
    assert result["error"]["details"] == [{"field": "input", "message": PATTERN_MESSAGE}], result


@pytest.mark.parametrize(("shape", "extra", "value"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_backtracking_pattern_is_cut_off_for_every_keyword(
    target: Target, shape: str, extra: dict[str, Any], value: dict[str, Any]
) -> None:
    t = tenant(target.runtime, target.client, f"patterns-{shape.replace(' ', '-')}")
    tool_id = t.tool("evil", CODE, language="python", input_schema=_schema(extra))
    _refused_for_time(t.invoke(tool_id, value))
    assert t.get_tool(tool_id)["usage_count"] == 0  # refused before any run
    tested = target.client.post(
        "/v1/custom-tools/test",
        json=_draft(t.workspace_id, "evil-draft", extra, input=value),
        headers=t.headers,
    )
    assert tested.status_code == 200, tested.text
    _refused_for_time(tested.json()["data"])


def test_a_backtracking_pattern_is_cut_off_through_ctx(target: Target) -> None:
    t = tenant(target.runtime, target.client, "patterns-ctx")
    inner = t.tool("evil-inner", CODE, language="python", input_schema=_schema(SHAPES[0][1]))
    assert inner
    caller = t.tool(
        "calls-evil",
        f"def handle(input, ctx):\n    return ctx.tools['evil-inner']({{'x': {TEXT!r}}})\n",
        language="python",
    )
    out = t.invoke(caller, {})
    assert out["status"] == "ok", out
    envelope = out["raw_data"]
    assert envelope["error"] == "invalid_input", out
    assert envelope["details"]["details"] == [{"field": "input", "message": PATTERN_MESSAGE}], out


class _Searches:
    """When each search of the searcher began and ended (monotonic), as it runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.spans: list[list[float]] = []
        self.began = threading.Event()
        real = patterns.PatternProcesses.search

        def search(*args: Any, **kwargs: Any) -> Any:
            span = [time.monotonic(), float("inf")]
            self.spans.append(span)
            self.began.set()
            try:
                return real(*args, **kwargs)
            finally:
                span[1] = time.monotonic()

        monkeypatch.setattr(patterns.PatternProcesses, "search", search)


def test_the_service_answers_others_while_a_pattern_backtracks(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search runs with the GIL released: another caller's request is answered while the
    attack's search is still running (under ``re`` it waited for the whole search)."""
    t = tenant(target.runtime, target.client, "patterns-meanwhile")
    tool_id = t.tool("evil", CODE, language="python", input_schema=_schema(SHAPES[0][1]))
    plain = t.tool("plain", CODE, language="python")
    searches = _Searches(monkeypatch)
    result: list[dict[str, Any]] = []
    big = {"x": TEXT, "pad": [0] * 9000}  # a value this size may search for 2 s
    thread = threading.Thread(target=lambda: result.append(t.invoke(tool_id, big)))
    thread.start()
    assert searches.began.wait(30), "the attack's search never began"
    answered = t.invoke(plain, {})
    answered_at = time.monotonic()
    thread.join(timeout=60)
    assert answered["status"] == "ok", answered
    assert result, "the attack's request never answered"
    _refused_for_time(result[0])
    began, ended = searches.spans[0]
    assert began < answered_at < ended, (began, answered_at, ended)


def test_other_threads_run_while_a_pattern_backtracks(
    monkeypatch: pytest.MonkeyPatch, searcher: Any
) -> None:
    """In-process: a thread that notes the time in a loop while another checks the attack's
    value runs in the middle of the search (under ``re`` it ran before and after it only)."""
    validator = compile_validator(_schema(SHAPES[0][1]), searcher)
    searches = _Searches(monkeypatch)
    finished = threading.Event()
    out: list[Any] = []

    def check() -> None:
        out.append(input_problems(validator, {"x": TEXT}))
        finished.set()

    thread = threading.Thread(target=check)
    thread.start()
    assert searches.began.wait(30)
    seen: list[float] = []
    while not finished.is_set():
        seen.append(time.monotonic())
    thread.join()
    assert out == [[{"field": "input", "message": PATTERN_MESSAGE}]]
    began, ended = searches.spans[0]
    quarter = (ended - began) / 4
    assert any(began + quarter < s < ended - quarter for s in seen), (began, ended, len(seen))


# Patterns and texts where other engines (the ``regex`` module among them) judge otherwise.
ORDINARY = [
    ("^[a-z]+$", ["abc", "ab1"]),
    ("^\\d{3}-\\d{4}$", ["555-1234", "5551234", "\U00011f50" * 3 + "-1234"]),
    ("(?i)^hello", ["HELLO there", "oh hello"]),
    ("^(a|aa)+$", ["aaaa", "aab"]),
    ("\\bfoo\\b", ["a foo here", "foó", "foo_"]),
    ("^\\S+$", ["abc", "\x1c", "\x1f", "a b"]),
    ("^\\w+$", ["e\u0301", "\u0903", "\u200d", "\u00b2", "\U00011f00", "abc"]),
    ("^[[:alpha:]]+$", ["abc", "a]", ":]"]),
    ("^ab{e<=1}$", ["ac", "ab{e<=1}"]),
    ("(?x)a{1 0}", ["a" * 10, "a{10}"]),
    ("^[\\w.+-]+/[\\w.+-]+$", ["text/plain", "a b/c"]),
    ("^\\N{LATIN SMALL LETTER A}+$", ["aaa", "b"]),  # re imports unicodedata for it
]


# ECMA-262's "$" (JSON Schema's patterns are ECMA's): the end of the text, not also before a
# final newline as in re ("abc\n" passed ^[a-z]+$, and "text/plain\n" became a header).
AT_THE_END = [
    ("^[a-z]+$", {"abc": True, "abc\n": False, "ab1": False}),
    ("^a$|^b$", {"a": True, "b\n": False, "a\n": False}),
    ("^[$]+$", {"$$": True, "$\n": False}),
    ("^[^]$]+$", {"ab": True, "a$": False, "ab\n": True}),  # the class takes the newline
    ("^a\\$b$", {"a$b": True, "a$b\n": False}),
    ("(?m)^a$", {"a\nb": True}),  # re's own multiline flag, set inline, keeps its meaning
]


@pytest.mark.parametrize(("pattern", "texts"), AT_THE_END, ids=[p for p, _ in AT_THE_END])
def test_dollar_is_the_end_of_the_text(pattern: str, texts: dict[str, bool], searcher: Any) -> None:
    schemas = [
        _schema({"properties": {"x": {"type": "string", "pattern": pattern}}}),
        _schema({"patternProperties": {pattern: {}}, "additionalProperties": False}),
    ]
    for i, schema in enumerate(schemas):
        validator = compile_validator(schema, searcher)
        for text, valid in texts.items():
            value = {"x": text} if i == 0 else {text: 1}
            assert (input_problems(validator, value) == []) == valid, (pattern, text)


@pytest.mark.parametrize(("pattern", "texts"), ORDINARY, ids=[p for p, _ in ORDINARY])
def test_patterns_judge_exactly_as_re_does(pattern: str, texts: list[str], searcher: Any) -> None:
    schemas = [
        _schema({"properties": {"x": {"type": "string", "pattern": pattern}}}),
        _schema({"patternProperties": {pattern: {}}, "additionalProperties": False}),
    ]
    for i, schema in enumerate(schemas):
        validator = compile_validator(schema, searcher)
        reference = Draft202012Validator(schema)  # jsonschema on Python's re, in this thread
        for text in texts:
            value = {"x": text} if i == 0 else {text: 1}
            problems = input_problems(validator, value)
            assert (problems == []) == reference.is_valid(value), (pattern, text, problems)
            assert all(PATTERN_MESSAGE not in p["message"] for p in problems)


def test_every_search_of_jsonschemas_keywords_is_bounded() -> None:
    """Every function of the two modules whose keywords search a schema's patterns that
    searches (itself, or through a helper that does) is evaluated by ``Budgeted`` as a copy
    whose ``re`` is the bounded one; jsonschema's own modules keep ``re``. Any other search in
    jsonschema (a newer jsonschema) fails here. (``_legacy_keywords`` serves drafts before
    2020-12 only; ``_format`` compiles, and its ``regex`` check is replaced.)"""
    import jsonschema._keywords
    import jsonschema._utils

    root = Path(jsonschema.__file__).parent
    searching = set()
    for source in root.glob("*.py"):
        if re.search(r"\bre\.(search|match|fullmatch|finditer|findall)\(", source.read_text()):
            searching.add(source.stem)
    assert searching == {"_keywords", "_utils", "_legacy_keywords"}, searching

    def using(module: Any, names: set[str]) -> set[str]:
        return {
            name
            for name, fn in vars(module).items()
            if isinstance(fn, FunctionType)
            and fn.__module__ == module.__name__
            and names & set(fn.__code__.co_names)
        }

    helpers = using(jsonschema._utils, {"re"})
    assert helpers == set(budget.SEARCHING_HELPERS)
    keywords = using(jsonschema._keywords, {"re", *helpers})
    assert keywords == set(budget.SEARCHING_KEYWORDS)
    for name, fn in budget.SEARCHING_KEYWORDS.items():
        assert fn.__code__ is getattr(jsonschema._keywords, name).__code__
        assert fn.__globals__["re"] is budget.SEARCHING_RE
        assert all(fn.__globals__[h].__globals__["re"] is budget.SEARCHING_RE for h in helpers)
        assert budget.Budgeted.VALIDATORS[name] is not Draft202012Validator.VALIDATORS[name]
    assert jsonschema._keywords.re is re and jsonschema._utils.re is re
    used = {fn.__module__ for fn in Draft202012Validator.VALIDATORS.values()}
    assert "jsonschema._legacy_keywords" not in used, used


def test_jsonschema_for_other_users_searches_with_re() -> None:
    """The bound is the service's validator's alone: a jsonschema validator made elsewhere in
    the process (the MCP SDK's) searches as jsonschema does."""
    schema = {"properties": {"x": {"pattern": "^[a-z]+$"}}}
    assert Draft202012Validator(schema).is_valid({"x": "abc\n"})  # re's $, not ECMA-262's
    assert input_problems(compile_validator(schema, None), {"x": "abc\n"}) != []


def test_a_pattern_re_cannot_compile_is_refused_on_save(target: Target) -> None:
    """Counts past 2**32 (OverflowError) and nesting past ``re``'s parser (RecursionError)
    were 500s on save; they are no regex (422 naming the field)."""
    for extra, field in [
        ({"properties": {"x": {"pattern": "a{4294967296}"}}}, "input_schema.properties.x.pattern"),
        ({"properties": {"x": {"pattern": "(" * 600 + ")" * 600}}}, "input_schema.properties.x.pattern"),
        ({"patternProperties": {"b{4294967296}": {}}}, "input_schema.patternProperties"),
        ({"patternProperties": {"b": {}, "(?x)a": {}}}, "input_schema.patternProperties"),
    ]:  # fmt: skip
        problems = check_schema(_schema(extra), searcher=patterns.shared())
        assert [p["field"] for p in problems] == [field], problems
        r = target.client.post(
            "/v1/custom-tools",
            json=_draft(target.workspace_id, "uncompiled", extra),
            headers=target.headers,
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"]["details"][0]["field"] == field


def test_a_stored_pattern_that_cannot_be_used_refuses_inputs(target: Target) -> None:
    t = tenant(target.runtime, target.client, "patterns-stored")
    tool_id = t.tool("stored", CODE, language="python")
    stored = _schema(
        {
            "properties": {"x": {"type": "string", "pattern": "(unclosed"}},
            "patternProperties": {"b": {}, "(?x)a": {}},  # joined: a flag not at the start
            "additionalProperties": False,
        }
    )
    with target.runtime.database.engine.begin() as conn:  # as an older version saved it
        for table in (tables.tools, tables.tool_versions):
            key = table.c.id if table is tables.tools else table.c.tool_id
            conn.execute(sa.update(table).where(key == tool_id).values(input_schema=stored))
    for value in ({"x": "a"}, {"zz": 1}):
        refused = t.invoke(tool_id, value)
        assert refused["error"]["code"] == "invalid_input", refused
        assert "cannot be matched" in refused["error"]["details"][0]["message"], refused
    assert t.invoke(tool_id, {})["status"] == "ok"  # no text to match: nothing to refuse


def test_format_regex_on_a_callers_text(searcher: Any) -> None:
    validator = compile_validator(_schema({"properties": {"r": {"format": "regex"}}}), searcher)
    assert input_problems(validator, {"r": "^a+$"}) == []
    for text in ["(unclosed", "a{4294967296}", "(" * 5000 + ")" * 5000]:
        found = input_problems(validator, {"r": text})
        assert [p["field"] for p in found] == ["input.r"], (text[:20], found)
    slow = "a" * 400_000 + "|" + "a" * 400_000  # re's parser: quadratic (~20 s here)
    assert input_problems(validator, {"r": slow}) == [
        {"field": "input", "message": PATTERN_MESSAGE}
    ]


def test_a_schema_whose_patterns_take_long_to_compile_is_refused_on_save(target: Target) -> None:
    """re's parser took ~6.7 ms for each wide class under (?i): compiled in a process of its
    own on save, past SAVE_SECONDS the schema is refused (the service answered meanwhile)."""
    slow = "(?i)" + "[\x01-\uffff]" * 2000
    r = target.client.post(
        "/v1/custom-tools",
        json=_draft(target.workspace_id, "slow-compile", {"properties": {"x": {"pattern": slow}}}),
        headers=target.headers,
    )
    assert r.status_code == 422, r.text
    assert "to compile" in r.json()["error"]["details"][0]["message"]


def test_a_non_string_pattern_reached_by_ref_is_refused_not_a_500(target: Target) -> None:
    t = tenant(target.runtime, target.client, "patterns-hidden")
    hidden = {"x-hidden": {"pattern": 5}, "properties": {"v": {"$ref": "#/x-hidden"}}}
    tool_id = t.tool("hidden", CODE, language="python", input_schema=_schema(hidden))
    refused = t.invoke(tool_id, {"v": "abc"})
    assert refused["error"]["code"] == "invalid_input", refused
    assert "is not a regular expression" in refused["error"]["details"][0]["message"]


def test_a_process_outlives_the_thread_that_started_it(searcher: Any) -> None:
    """The kernel's parent-death signal follows the thread that forked: a process started for
    a thread that has ended still answers another thread."""
    patterns.shared().close_idle()
    out: list[bool] = []
    maker = threading.Thread(
        target=lambda: out.append(searcher.search("^a", "ab", time.monotonic() + 30))
    )
    maker.start()
    maker.join()
    assert out == [True]
    time.sleep(0.2)  # the signal, had it been armed for that thread, has come by now
    assert searcher.search("^b", "ba", time.monotonic() + 30) is True
    assert searcher.started == 1, searcher.started  # the same process answered both


def test_descriptors_past_1023_do_not_break_matching(searcher: Any) -> None:
    patterns.shared().close_idle()
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert searcher.search("^a", "ab", time.monotonic() + 30) is True
    finally:
        for fd in held:
            os.close(fd)


def test_a_burst_of_valid_values_is_not_refused_for_time(searcher: Any) -> None:
    """Starting processes is not the values' time: 30 values checked at once, each with a
    pattern, are all judged (more than RUNNING wait for a free process)."""
    patterns.shared().close_idle()
    validator = compile_validator(_schema({"properties": {"x": {"pattern": "^a+$"}}}), searcher)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(input_problems(validator, {"x": "aaa"})))
        for _ in range(30)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[]] * 30, [r for r in results if r]
