"""A value against a tool's input schema: jsonschema judges, within the check's budget;
jsonschema-rs answers first where both read the schema alike."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema_rs
from referencing.exceptions import Unresolvable

from toolkiln.domain.problems import Problem, problem, text_problems
from toolkiln.domain.schema.budget import (
    ENUM_WORK,
    FORMATS,
    MAX_ERRORS,
    PATTERN_MESSAGE,
    PATTERN_SECONDS,
    PATTERN_SECONDS_MAX,
    PATTERN_SECONDS_PER_PART,
    RS_WORK,
    STEPS,
    STEPS_MAX,
    STEPS_MESSAGE,
    STEPS_PER_PART,
    Budgeted,
    OutOfSteps,
    OutOfTime,
    Searcher,
    Unmatchable,
    armed,
)
from toolkiln.domain.schema.parameters import DIALECT
from toolkiln.domain.schema.references import (
    MAX_APPLIED,
    Graph,
    registry_of,
    runaway_in,
    written_nodes,
)

# Keywords that jsonschema-rs and jsonschema read alike (both pass the official test suite;
# numbers below 2**53 in magnitude: see _small_numbers), by where their values hold schemas.
# Not here, so never answered by jsonschema-rs: ``format`` (asserted by our jsonschema, an
# annotation there), ``pattern`` and ``patternProperties`` (ECMA 262 regular expressions
# there, Python's here), ``multipleOf`` (Python's float division here: 0.07 is not a multiple
# of 0.01), identifiers and anchors (``$id``, ``$anchor``, ``$dynamic*``), a ``$schema`` below
# the root or naming another dialect, a ``$ref`` other than ``#`` or ``#/$defs/<name>`` (a
# remote one jsonschema-rs would try to fetch; a pointer into a value would make it a schema),
# and every keyword not listed.
_ONE = {
    "items", "not", "additionalProperties", "contains", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties",
}  # fmt: skip
_LIST = {"allOf", "anyOf", "oneOf", "prefixItems"}
_MAP = {"properties", "$defs", "dependentSchemas"}
_PLAIN = {
    "type", "enum", "const", "required", "dependentRequired",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "uniqueItems", "minContains", "maxContains",
    "minProperties", "maxProperties",
    "$comment", "title", "description", "default", "examples", "deprecated",
    "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
}  # fmt: skip


_LOCAL_REF = re.compile(r"#(/\$defs/[A-Za-z0-9_.-]+)?")
# jsonschema-rs compares numbers at or beyond 2**53 inexactly where an integer meets a float
# (maximum, exclusiveMinimum, const, enum and uniqueItems are wrong there).
_EXACT = 2**53


def _small_numbers(value: Any) -> bool:
    """Whether every number in ``value`` is below 2**53 in magnitude."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int | float):
        return -_EXACT < value < _EXACT
    if isinstance(value, list):
        return all(_small_numbers(v) for v in value)
    if isinstance(value, dict):
        return all(_small_numbers(v) for v in value.values())
    return False


def _enum_parts(schema: Any) -> int:
    """How many values the schema's ``enum`` and ``const`` keywords hold in all: what a
    value's every part may be compared with. Every key is walked (an ``enum`` key in data,
    under ``default`` say, counts too: a property may be named ``default``)."""
    total, todo = 0, [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for key, sub in node.items():
                if key == "enum" and isinstance(sub, list):
                    total += sum(_parts(v) for v in sub)
                elif key == "const":
                    total += _parts(sub)
                else:
                    todo.append(sub)
        elif isinstance(node, list):
            todo.extend(node)
    return total


def _parts(value: Any) -> int:
    """How many values ``value`` holds, itself included."""
    if isinstance(value, dict):
        return 1 + sum(_parts(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_parts(v) for v in value)
    return 1


def _shared_keywords_only(schema: Any, root: bool = True) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in _PLAIN:
            if not _small_numbers(value):
                return False
            continue
        if key == "$schema":  # 2020-12 at the root only: elsewhere a dialect could change
            if not (root and value == DIALECT):
                return False
        elif key == "$ref":  # the root or one of its $defs (walked here): a pointer could
            # name a value (``#/default``) and make it a schema nobody checked
            if not (isinstance(value, str) and _LOCAL_REF.fullmatch(value)):
                return False
        elif key in _ONE:
            if not _shared_keywords_only(value, False):
                return False
        elif key in _LIST:
            if not isinstance(value, list) or not all(_shared(v) for v in value):
                return False
        elif key in _MAP:
            if not isinstance(value, dict) or not all(_shared(v) for v in value.values()):
                return False
        else:
            return False
    return True


def _shared(schema: Any) -> bool:
    return _shared_keywords_only(schema, False)


def _unless_panic(exc: BaseException) -> None:
    """Re-raise anything but an error or a Rust panic (pyo3's PanicException is a
    BaseException) of jsonschema-rs."""
    if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
        raise exc


class InputValidator:
    """A schema's validator. jsonschema is the judge: a value it finds invalid is refused,
    with its messages. For a schema made only of keywords both libraries read alike,
    jsonschema-rs answers first (~0.4 µs against ~28 µs for the built-ins' schemas: every
    ``ctx.tools`` call validates its input; docs/decisions/116-ctx-input-validation.md): a value it
    finds valid is valid; any other answer (invalid, or it could not take the value) goes to
    jsonschema. ``searcher``: where the schema's patterns are searched against a value: a
    tool author's schema needs one; the service's own schemas, whose patterns are its own,
    are searched by ``re`` in the calling thread (None)."""

    __slots__ = ("_fast", "_ways", "enum_parts", "reference", "runaway", "searcher")

    def __init__(self, schema: dict[str, Any], searcher: Searcher | None) -> None:
        self.searcher = searcher
        self._fast: Any = None
        self.enum_parts = _enum_parts(schema)
        self.runaway: tuple[str, str] | None = None
        self._ways: int | None = None  # ways down from the root; None: unbounded (recursive)
        try:
            resolver, registry = registry_of(schema)
            if '"$ref"' in json.dumps(schema):
                graph = Graph(schema, resolver)
                # Stored before saving refused them: no value is checked against such a one.
                self.runaway = runaway_in(graph)
                if self.runaway is None:
                    self._ways = graph.paths_down(graph.loop[1])
            else:  # a tree: a way down to each subschema
                self._ways = len(written_nodes(schema))
            # Resolved in the schema's own registry only (jsonschema's default adds the
            # bundled metaschemas, which a $ref could name: refused as never fetched).
            self.reference = Budgeted(
                schema,
                format_checker=FORMATS,
                registry=registry,
                _resolver=resolver,
            )
        except Exception as exc:  # stored before save refused it (an $id or $defs of the
            # wrong type, an $id that is no URI): no value is checked against it
            self.runaway, self._ways = ("", f"cannot be used ({str(exc)[:200]})"), None
            self.reference = None
            return
        try:  # offline: never a fetch, whatever the schema says
            if (
                self._ways is not None
                and self._ways <= MAX_APPLIED
                and _shared_keywords_only(schema)
            ):
                self._fast = jsonschema_rs.Draft202012Validator(schema, offline=True)
        except BaseException as exc:  # jsonschema alone judges a schema it cannot take
            _unless_panic(exc)

    @property
    def fast(self) -> bool:
        """Whether jsonschema-rs answers for valid values of this schema."""
        return self._fast is not None

    def surely_valid(self, value: Any) -> bool:
        if self._fast is None or not _small_numbers(value):
            return False
        # jsonschema-rs has no budget: jsonschema, which has, judges where the work may be
        # large. For the ways down the schema; and for comparing each part with each enum
        # and const value, which it does holding the interpreter (60,000 items against
        # 1,500 enum objects would hold every request of the service 13 s; jsonschema
        # charges each comparison to the value's budget, _cost).
        ways = self._ways if self._ways is not None and self._ways > 100 else 0
        if ways or self.enum_parts:
            parts = _parts(value)
            if ways * parts > RS_WORK or self.enum_parts * parts > ENUM_WORK:
                return False
        try:
            return bool(self._fast.is_valid(value))
        except BaseException as exc:  # a value it cannot take: jsonschema judges
            _unless_panic(exc)
            return False


def compile_validator(schema: dict[str, Any], searcher: Searcher | None) -> InputValidator:
    return InputValidator(schema, searcher)


def input_problems(validator: InputValidator, value: Any) -> list[Problem]:
    """Every place the input breaks the schema, as problems with a dotted ``field``; text
    that is not storable Unicode (NUL, lone surrogates) is refused before the schema."""
    out: list[Problem] = text_problems("input", value)
    if out or validator.surely_valid(value):
        return out
    if validator.runaway is not None or validator.reference is None:
        where, why = validator.runaway or ("", "cannot be used")
        return [problem("input", f"the tool's input schema at {where or 'its root'} {why}")]
    parts = _parts(value)
    steps = min(STEPS + STEPS_PER_PART * parts, STEPS_MAX)
    seconds = min(PATTERN_SECONDS + PATTERN_SECONDS_PER_PART * parts, PATTERN_SECONDS_MAX)
    try:
        with armed(steps, seconds, validator.searcher):
            found = itertools.islice(validator.reference.iter_errors(value), MAX_ERRORS)
            errors = sorted(found, key=lambda e: list(e.absolute_path))
    except OutOfSteps:
        return [problem("input", STEPS_MESSAGE)]
    except OutOfTime:
        return [problem("input", PATTERN_MESSAGE)]
    except Unmatchable as exc:
        return [problem("input", f"the tool's input schema has a regular expression: {exc}")]
    except Unresolvable as exc:
        ref = str(getattr(exc, "ref", ""))[:200]
        return [problem("input", f"the schema refers to {ref!r}, which is never fetched")]
    except BaseException as exc:  # a loop runaway does not follow ($dynamicRef)
        if not isinstance(exc, RecursionError):
            _unless_panic(exc)  # referencing's Rust maps (rpds) turn it into a panic
            if isinstance(exc, Exception):
                raise
        return [problem("input", "the tool's input schema refers to itself without end")]
    for err in errors:
        path = ["input", *(str(p) for p in err.absolute_path)]
        if err.validator == "required" and isinstance(err.instance, dict):
            # Name the missing property itself, so a model (or a form) knows which one.
            missing = [r for r in err.validator_value if r not in err.instance]
            out += [problem(".".join([*path, str(r)]), err.message[:500]) for r in missing[:1]]
        else:
            out.append(problem(".".join(path), err.message[:500]))
        if len(out) >= 20:
            break
    return out
