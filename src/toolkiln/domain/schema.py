"""Input schemas: the seed's ``parameters`` map, JSON Schema 2020-12, and the two-way conversion."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import jsonschema_rs
from jsonschema import Draft202012Validator, FormatChecker, _keywords, _utils, validators
from referencing import Registry, Resource
from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unresolvable, Unretrievable
from referencing.jsonschema import DRAFT202012

from toolkiln.domain.limits import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from toolkiln.domain.problems import Problem, json_depth, problem, text_problems

DIALECT = "https://json-schema.org/draft/2020-12/schema"
JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def parameters_to_schema(parameters: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """``{"x": {"type": "string", "required": true}}`` -> an object schema with ``required``."""
    problems: list[Problem] = []
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in parameters.items():
        field = f"parameters.{name}"
        if not name or len(name) > 64:
            problems.append(problem(field, "parameter names must be 1 to 64 characters"))
            continue
        if not isinstance(spec, dict):
            problems.append(problem(field, 'must be an object such as {"type": "string"}'))
            continue
        spec = dict(spec)
        req = spec.pop("required", False)
        if not isinstance(req, bool):
            problems.append(problem(f"{field}.required", "must be true or false"))
        elif req:
            required.append(name)
        kind = spec.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is None or not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
            problems.append(
                problem(f"{field}.type", f"must be one of {', '.join(sorted(JSON_TYPES))}")
            )
        properties[name] = spec
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema, problems


def schema_to_parameters(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``parameters`` view of a schema, or None when the schema says more than it can hold."""
    if set(schema) - {"type", "properties", "required", "additionalProperties", "$schema"}:
        return None
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or not isinstance(properties, dict):
        return None
    required = set(schema.get("required", []))
    if not required <= set(properties):
        return None  # a required name with no property: the form cannot say it is needed
    out: dict[str, Any] = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict):
            return None
        out[name] = {**spec, "required": name in required}
    return out


def _metaschema_problem(schema: dict[str, Any], field: str) -> Problem | None:
    """The metaschema's verdict (its ``format: regex`` included), then what this service asks
    of a schema's shape: an object root, ``$schema`` at the root only, and
    ``patternProperties`` whose patterns joined are a regex."""
    # As Draft202012Validator.check_schema (its first error), by a validator that counts
    # its steps: unbudgeted, 4,000 empty properties (51 KB) held a thread 3-7 s.
    error = next(iter(_metaschema().iter_errors(schema)), None)
    if error is not None:
        path = ".".join(str(p) for p in error.path)
        return problem(f"{field}.{path}" if path else field, error.message)
    if schema.get("type") != "object":
        return problem(f"{field}.type", 'the root must be {"type": "object", ...}')
    below = [p for n, p in _written_nodes(schema) if n is not schema and "$schema" in n]
    if below:  # a dialect of its own would be validated by a validator without a budget
        return problem(".".join([field, *below[0], "$schema"]), "is allowed at the root only")
    for node, at in _written_nodes(schema):
        keys = node.get("patternProperties") if isinstance(node, dict) else None
        if isinstance(keys, dict) and len(keys) > 1 and not _is_regex("|".join(keys)):
            # additionalProperties searches them as one pattern: a flag such as (?x) then
            # stands in the middle, which re refuses
            why = "joined with | (as additionalProperties reads them), its patterns are no regex"
            return problem(".".join([field, *at, "patternProperties"]), why)
    return None


def check_schema(schema: Any, field: str = "input_schema") -> list[Problem]:
    """A valid 2020-12 schema with an object at its root, within the size and depth caps."""
    if not isinstance(schema, dict):
        return [problem(field, "must be a JSON object")]
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        return [problem(field, f"is larger than {MAX_SCHEMA_BYTES} bytes")]
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        return [problem(field, f"is nested deeper than {MAX_SCHEMA_DEPTH} levels")]
    nul = text_problems(field, schema)
    if nul:
        return nul
    if schema.get("$schema", DIALECT) != DIALECT:
        return [problem(f"{field}.$schema", f"only {DIALECT} is supported")]
    try:
        # The author's patterns compiled where values are matched: re's parser can take
        # seconds for a 64 KB schema (``(?i)`` and many wide classes).
        with _armed(SAVE_STEPS, SAVE_SECONDS):
            found_problem = _metaschema_problem(schema, field)
    except OutOfSteps:
        return [problem(field, SAVE_STEPS_MESSAGE)]
    except OutOfTime:
        return [
            problem(
                field,
                f"has regular expressions that took longer than {SAVE_SECONDS:g} s to compile",
            )
        ]
    except Unmatchable as exc:
        return [problem(field, f"has a regular expression that cannot be used: {exc}")]
    if found_problem is not None:
        return [found_problem]
    try:
        found = runaway(schema)
    except ValueError as exc:  # an $id urljoin cannot take
        return [problem(field, f"has an $id that is not a URI: {str(exc)[:200]}")]
    if found is not None:
        return [problem(f"{field}.{found[0]}" if found[0] else field, found[1])]
    return []


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


# Where a schema applies its subschemas: to the value itself (a ``$ref`` too), or to a part of
# it (a property, an item, a key). A ``$ref`` that comes back to where it started through the
# first kind only never reaches a part of the value: validating anything against it recurses
# without end (jsonschema: RecursionError; jsonschema-rs: a guess). Without a loop, the first
# kind can still multiply: ``allOf: [{$ref: next}, {$ref: next}]`` down a chain of 18
# definitions applied 2**18 schemas to one value (9.0 s of CPU, holding the GIL).
_IN_PLACE_ONE = ("not", "if")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas",)
_INTO_ONE = (
    "items", "additionalProperties", "contains", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip
_INTO_LIST = ("prefixItems",)
_INTO_MAP = ("properties", "patternProperties")  # $defs: applied where referenced only
_IN_PLACE = (_IN_PLACE_ONE, _IN_PLACE_LIST, _IN_PLACE_MAP)
_INTO = (_INTO_ONE, _INTO_LIST, _INTO_MAP)
MAX_APPLIED = 10_000  # subschemas one applies to its value in place, counting repeats
LOOP_MESSAGE = (
    "refers back to where it started without applying to a part of the value (only through "
    "$ref, allOf, anyOf, oneOf, not, if/then/else or dependentSchemas), so checking a value "
    "against it never ends: a recursive schema goes through properties, items or another "
    "keyword that applies to a part of the value"
)
FANOUT_MESSAGE = (
    f"applies more than {MAX_APPLIED} subschemas to one value (through $ref, allOf, anyOf, "
    "oneOf, not, if/then/else or dependentSchemas, counting each time a subschema is reached "
    "again), so checking a value against it would take too long"
)

NOT_SCHEMA_MESSAGE = "refers to a value that is not a schema (an object or a boolean)"
DANGLING_MESSAGE = "refers to a place the schema does not have (no such pointer or anchor)"

_Edge = tuple[Any, list[str]]


def _subschemas(
    node: dict[str, Any],
    path: list[str],
    one: tuple[str, ...],
    many: tuple[str, ...],
    named: tuple[str, ...],
) -> list[_Edge]:
    out: list[_Edge] = []
    for key in one:
        if isinstance(node.get(key), dict):
            out.append((node[key], [*path, key]))
    for key in many:
        if isinstance(node.get(key), list):
            out += [
                (v, [*path, key, str(i)]) for i, v in enumerate(node[key]) if isinstance(v, dict)
            ]
    for key in named:
        if isinstance(node.get(key), dict):
            out += [(v, [*path, key, str(k)]) for k, v in node[key].items() if isinstance(v, dict)]
    return out


def _then_else(node: dict[str, Any], path: list[str]) -> list[_Edge]:
    """``then`` and ``else`` apply only beside an ``if``, and only the one ``if`` can take."""
    if "if" not in node:
        return []
    keys = (
        ("then",) if node["if"] is True else ("else",) if node["if"] is False else ("then", "else")
    )
    return _subschemas(node, path, keys, (), ())


def _written_nodes(schema: dict[str, Any]) -> list[_Edge]:
    """Every subschema where it is written (keywords that hold schemas, and ``$defs``)."""
    todo: list[_Edge] = [(schema, [])]
    for node, path in todo:
        todo += _subschemas(node, path, *_IN_PLACE) + _subschemas(
            node, path, ("then", "else"), (), ()
        )
        todo += _subschemas(node, path, *_INTO) + _subschemas(node, path, (), (), ("$defs",))
    return todo


def _written(schema: dict[str, Any]) -> dict[int, list[str]]:
    paths: dict[int, list[str]] = {}
    for node, path in _written_nodes(schema):
        paths.setdefault(id(node), path)
    return paths


_NOWHERE = object()  # a reference into the schema (or one of its $id resources) that has
# no such place: a JSON pointer or an anchor it lacks


def _lookup(base: Any, ref: object) -> Any:
    """Where ``ref`` leads, or None: not a reference, or not in the schema (never fetched);
    ``_NOWHERE`` for a place in the schema that does not exist."""
    if not isinstance(ref, str):
        return None
    try:
        return base.lookup(ref)
    except (PointerToNowhere, NoSuchAnchor):
        return _NOWHERE
    except Exception:
        return None


class _Graph:
    """Every subschema validation reaches from the root, with the subschemas each applies to
    the same value (``inner``: in place, a ``$ref`` too) and to a part of it (``into``)."""

    def __init__(self, schema: dict[str, Any], resolver: Any) -> None:
        self.schema = schema
        self.written = _written(schema)  # where each subschema is, to name it
        self.nodes: dict[int, dict[str, Any]] = {}
        self.paths: dict[int, list[str]] = {}
        self.inner: dict[int, list[tuple[int, list[str]]]] = {}  # (child, the edge's path)
        self.into: dict[int, list[int]] = {}
        self.not_schema: list[list[str]] = []  # a $ref to a value that is no schema
        self.dangling: list[list[str]] = []  # a $ref to a place the schema does not have
        todo: list[tuple[dict[str, Any], list[str], Any]] = [(schema, [], resolver)]
        for node, path, base in todo:  # breadth first, in the order written
            if id(node) in self.nodes:
                continue
            if node is not schema and isinstance(node.get("$id"), str):
                base = base.in_subresource(DRAFT202012.create_resource(node))
            self.nodes[id(node)] = node
            path = self.paths[id(node)] = self.written.get(id(node), path)
            into = _subschemas(node, path, *_INTO)
            inner = _subschemas(node, path, *_IN_PLACE) + _then_else(node, path)
            todo += [(c, where, base) for c, where in into + inner]
            self.into[id(node)] = [id(c) for c, _ in into]
            self.inner[id(node)] = [(id(c), where) for c, where in inner]
            target = _lookup(base, node.get("$ref"))
            if target is _NOWHERE:
                self.dangling.append([*path, "$ref"])
            elif target is not None and not isinstance(target.contents, dict | bool):
                self.not_schema.append([*path, "$ref"])
            elif target is not None and isinstance(target.contents, dict):
                # A pointer may name a place no keyword applies: its base is where it is.
                todo.append((target.contents, [*path, "$ref"], target.resolver))
                self.inner[id(node)].append((id(target.contents), [*path, "$ref"]))

    @functools.cached_property
    def loop(self) -> tuple[str | None, list[int]]:
        """The path of an in-place edge that closes a loop (or None), and the subschemas
        children first (a topological order of the in-place edges, read backwards)."""
        order: list[int] = []
        done: set[int] = set()
        for start in self.nodes:
            if start in done:
                continue
            active = {start}
            stack = [(start, iter(self.inner[start]))]
            while stack:  # depth first, without recursion: a chain of $refs may be long
                node, edges = stack[-1]
                step = next(edges, None)
                if step is None:
                    stack.pop()
                    active.discard(node)
                    done.add(node)
                    order.append(node)
                elif step[0] in active:
                    return ".".join(step[1]), order
                elif step[0] not in done:
                    active.add(step[0])
                    stack.append((step[0], iter(self.inner[step[0]])))
        return None, order

    def most_applied(self, order: list[int]) -> tuple[int, int]:
        """The most subschemas one subschema applies to its value in place, itself included
        and counting repeats, and which: the first (innermost) past MAX_APPLIED, if any."""
        applied: dict[int, int] = {}
        for node in order:  # children first
            applied[node] = 1 + sum(applied[child] for child, _ in self.inner[node])
            if applied[node] > MAX_APPLIED:
                return applied[node], node
        worst = max(applied, key=lambda k: applied[k])
        return applied[worst], worst

    def paths_down(self, order: list[int]) -> int | None:
        """How many ways down the schema there are from the root (in place and into parts of
        the value): an upper bound of the subschemas one value can meet, or None when the
        schema is recursive (a way down comes back), which bounds nothing."""
        colour: dict[int, int] = {}
        ways: dict[int, int] = {}
        for start in self.nodes:
            if colour.get(start):
                continue
            colour[start] = 1
            stack = [(start, iter(self._down(start)))]
            while stack:
                node, edges = stack[-1]
                child = next(edges, None)
                if child is None:
                    stack.pop()
                    colour[node] = 2
                    ways[node] = min(1 + sum(ways[c] for c in self._down(node)), 1 << 62)
                elif colour.get(child) == 1:
                    return None
                elif not colour.get(child):
                    colour[child] = 1
                    stack.append((child, iter(self._down(child))))
        return ways[id(self.schema)]

    def _down(self, node: int) -> list[int]:
        return [c for c, _ in self.inner[node]] + self.into[node]


def runaway(schema: dict[str, Any]) -> tuple[str, str] | None:
    """Where checking a value against ``schema`` would never end, or could apply more than
    MAX_APPLIED subschemas to one value: (the dotted path of the ``$ref`` that closes the
    loop, or of a subschema applied most; the message), or None. Only what validation
    reaches counts (an unused ``$defs`` entry is never applied); references resolve as the
    validator resolves them (``$id`` scopes included), and one that leaves the schema is never
    fetched and closes no loop. Raises ValueError for an ``$id`` that is no URI."""
    written = json.dumps(schema)
    if '"$ref"' not in written:  # neither without one (most schemas)
        if '"$id"' in written:  # but an $id that is no URI is refused all the same: stored,
            registry_of(schema)  # it would refuse every input
        return None
    graph = _Graph(schema, registry_of(schema)[0])
    found = _runaway(graph)
    if found is None and graph.dangling:
        # Refused on save only: a schema stored before still takes the values that never
        # reach the reference (and refuses those that do, as it always did).
        return ".".join(graph.dangling[0]), DANGLING_MESSAGE
    return found


def _runaway(graph: _Graph) -> tuple[str, str] | None:
    if graph.not_schema:  # jsonschema would fail on every value it reaches (a 500)
        return ".".join(graph.not_schema[0]), NOT_SCHEMA_MESSAGE
    closing, order = graph.loop
    if closing is not None:
        return closing, LOOP_MESSAGE
    count, node = graph.most_applied(order)
    if count > MAX_APPLIED:
        return ".".join(graph.paths[node]), FANOUT_MESSAGE
    return None


def registry_of(schema: dict[str, Any]) -> tuple[Any, Registry[Any]]:
    """A resolver rooted at ``schema`` and the registry it resolves in, that registry crawled
    once: an uncrawled one crawls the whole schema again for every ``$anchor`` or ``$id``
    reference from the root (880 of them in a 64 KB schema: 6.6 s of CPU per value)."""
    resource = DRAFT202012.create_resource(schema)
    uri = resource.id() or ""
    registry = _NO_RETRIEVAL.with_resource(uri, resource).crawl()
    return registry.resolver(base_uri=uri), registry


def _refuse_retrieval(uri: str) -> Resource[Any]:
    raise Unretrievable(ref=uri)  # type: ignore[call-arg]


# A ``$ref`` that is not in the schema itself is never fetched (jsonschema would fetch it over
# HTTP while validating, and warn): a value it would apply to is refused instead.
_NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


# Keywords jsonschema may evaluate for one value: a base, and more for each part of a larger
# value (each costs ~5-15 us of CPU here).
STEPS = 20_000
STEPS_PER_PART = 20
STEPS_MAX = 200_000  # whatever the value's size
ENUM_WORK = 5_000_000  # parts of the value x enum and const values jsonschema-rs may take on
RS_WORK = 5_000_000  # ways down the schema x parts of the value jsonschema-rs may take on
MAX_ERRORS = 100  # read from jsonschema, then sorted by place; the first 20 are reported
STEPS_MESSAGE = (
    "checking it against the tool's input schema took more steps than a value of its size "
    f"may ({STEPS} and {STEPS_PER_PART} for each part of the value, at most {STEPS_MAX})"
)


# All the searches of a tool's patterns (``pattern``, ``patternProperties`` and the
# keywords that consult them) and compiles of ``format: regex`` text for one value may take
# this long, in seconds: a base and more for each part of a larger value (a search in a
# process of its own costs ~0.1 ms), as for STEPS. They run in processes of their own
# (sandbox/patterns.py) when the service has given one (``use_searcher``).
PATTERN_SECONDS = 0.25
SAVE_SECONDS = 2.0  # compiling a schema's own patterns on save
# Keyword evaluations of the metaschema over a schema on save: about 100 per subschema, so a
# schema of up to ~1,000 subschemas (an ordinary 64 KB one has a few hundred); ~1 s of CPU.
SAVE_STEPS = 100_000
SAVE_STEPS_MESSAGE = (
    f"is too complex to check: checking it against the 2020-12 metaschema takes more than "
    f"{SAVE_STEPS} steps (about 100 for each subschema)"
)
PATTERN_SECONDS_PER_PART = 0.0002
PATTERN_SECONDS_MAX = 2.0
PATTERN_MESSAGE = (
    "matching it against the regular expressions of the tool's input schema took longer than "
    f"a value of its size may ({PATTERN_SECONDS} s and {PATTERN_SECONDS_PER_PART * 1000:g} ms "
    f"for each part of the value, at most {PATTERN_SECONDS_MAX:g} s)"
)


class _Budget(threading.local):
    armed = False  # only while _armed: input_problems, and check_schema's compiles
    left = STEPS
    until = 0.0  # time.monotonic() when the pattern searches and compiles must have ended


_BUDGET = _Budget()


@contextlib.contextmanager
def _armed(steps: int, seconds: float) -> Iterator[None]:
    """This thread's keyword evaluations and regular expressions bounded until the end."""
    _BUDGET.left, _BUDGET.until = steps, time.monotonic() + seconds
    _BUDGET.armed = True
    try:
        yield
    finally:
        _BUDGET.armed = False


class OutOfSteps(Exception):
    """Checking one value took more keyword evaluations than its budget."""


class OutOfTime(Exception):
    """The regular expressions of one check (a value's, or a schema's on save) took longer
    than its time."""


class Unmatchable(Exception):
    """A pattern that cannot be matched (its compile fails or runs out of memory)."""


class Searcher(Protocol):
    """Where a tool's regular expressions are matched against a caller's text, each until
    ``deadline`` (``time.monotonic()``): raises OutOfTime past it, Unmatchable for a pattern
    that cannot be used."""

    def search(self, pattern: str, text: str, deadline: float) -> bool: ...

    def compiles(self, text: str, deadline: float) -> bool: ...


_SEARCHER: Searcher | None = None


def use_searcher(searcher: Searcher | None) -> None:
    """The service's searcher (app.py). Without one (a library use of this module), values
    are matched by ``re`` in the calling thread, without a time limit."""
    global _SEARCHER
    _SEARCHER = searcher


_INLINE_MULTILINE = re.compile(r"\(\?[aiLmsux-]*m")


@functools.lru_cache(maxsize=4096)
def ecma_end(pattern: str) -> str:
    r"""A schema's pattern is an ECMA-262 regular expression, where ``$`` (without the ``m``
        flag, which a schema cannot set) matches only at the end of the text; ``re``'s also
        matches before a final newline, so ``^[a-z]+$`` let ``"abc
    "`` through. Each ``$``
        outside a character class becomes ``\Z``; a pattern that sets ``re``'s own multiline flag
        inline keeps its ``$``."""
    if "$" not in pattern or _INLINE_MULTILINE.search(pattern):
        return pattern
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            for lead in "^]":  # a ']' first in a class (after an optional '^') is literal
                if i < n and pattern[i] == lead:
                    out.append(lead)
                    i += 1
            continue
        elif c == "$":
            out.append("\\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


class _SearchingRe:
    """What jsonschema's keywords call ``re``: every search of a schema's patterns
    (``pattern``, ``patternProperties``, and ``additionalProperties`` and
    ``unevaluatedProperties``, which consult them) goes to the searcher, with the check's time
    left, while the budget is armed; elsewhere (the service's own schemas) it is ``re``'s. A
    test checks that no other search is left in jsonschema's keywords
    (tests/security/test_schema_patterns.py)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        searcher = _SEARCHER
        if isinstance(pattern, str):
            pattern = ecma_end(pattern)
        if not _BUDGET.armed or searcher is None or flags:
            return re.search(pattern, string, flags)
        if not isinstance(pattern, str) or not isinstance(string, str):
            # a pattern where no keyword the metaschema checks reads it, reached by $ref
            raise Unmatchable(f"{str(pattern)[:200]!r} is not a regular expression")
        return True if searcher.search(pattern, string, _BUDGET.until) else None


_keywords.re = _utils.re = _SearchingRe()


def _is_regex(instance: object) -> bool:
    """``format: regex``. A caller's text (while input_problems checks a value) is compiled by
    the searcher within the value's time (``re`` can take quadratic time: a long ``x|x``);
    anything ``re.compile`` raises, not only ``re.error`` (OverflowError for a count past
    2**32, RecursionError for deep nesting), makes it no regex, on save as for inputs."""
    if not isinstance(instance, str):
        return True
    searcher = _SEARCHER
    if _BUDGET.armed and searcher is not None:
        return searcher.compiles(instance, _BUDGET.until)
    try:
        re.compile(instance)
    except (re.error, OverflowError, RecursionError, ValueError, MemoryError):
        return False
    return True


FORMATS = FormatChecker()
FORMATS.checkers = {**Draft202012Validator.FORMAT_CHECKER.checkers}
FORMATS.checks("regex")(_is_regex)


def _spend(steps: int) -> None:
    if _BUDGET.armed:
        _BUDGET.left -= steps
        if _BUDGET.left < 0:
            raise OutOfSteps


_WALKS_THE_VALUE = frozenset(
    {
        "items", "prefixItems", "contains", "unevaluatedItems",
        "propertyNames", "unevaluatedProperties", "dependentSchemas", "dependentRequired",
    }
)  # fmt: skip


def _cost(name: str, value: Any, instance: Any) -> int:
    """What evaluating one keyword costs beyond one step, where it is more than its
    subschemas' own steps (which count themselves)."""
    if name == "enum" and isinstance(value, list):
        return len(value)
    if name in ("properties", "required") and isinstance(value, dict | list):
        return len(value)
    if name == "patternProperties" and isinstance(value, dict) and isinstance(instance, dict):
        return len(value) * len(instance)
    if name == "additionalProperties" and isinstance(instance, dict):
        return len(instance)
    if name == "uniqueItems" and value is True and isinstance(instance, list):
        n = len(instance)  # objects and arrays are compared pairwise (jsonschema's uniq)
        return n * n // 2 if any(isinstance(i, dict | list) for i in instance) else n
    if name in ("const", "enum") and isinstance(instance, dict | list):
        return len(instance) * (len(value) if name == "enum" and isinstance(value, list) else 1)
    if name in _WALKS_THE_VALUE and isinstance(instance, dict | list):
        return len(instance)  # even where the subschema is true or {} (no keyword of its own)
    return 0


def _counted(name: str, keyword: Any) -> Any:
    def evaluate(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend(1 + _cost(name, value, instance))  # before the work: it is what is bounded
        errors = keyword(validator, value, instance, schema)
        return None if errors is None else _charged(errors)

    return evaluate


def _charged(errors: Any) -> Any:
    for error in errors:  # each message holds a repr of its value: long ones cost more
        _spend(1 + len(error.message) // 256)
        yield error


def _evolve(self: Any, **changes: Any) -> Any:
    """jsonschema's evolve picks the validator a subschema's ``$schema`` names, one without
    this budget: the subschema is evaluated as the 2020-12 it must be (save refuses a
    ``$schema`` below the root; the root's must be 2020-12) by this validator."""
    _spend(1)  # every subschema entered, even one without keywords (true, {})
    schema = changes.get("schema", self.schema)
    if isinstance(schema, dict) and "$schema" in schema:
        changes["schema"] = {k: v for k, v in schema.items() if k != "$schema"}
    return _plain_evolve(self, **changes)


# jsonschema with a budget: every keyword it evaluates counts, so that a recursive schema
# applying two subschemas to each level of a value (2**depth evaluations: 3.9 s of CPU at 14
# levels, and values may nest 64 deep) ends with a refusal instead of holding a thread for
# hours; so do keywords whose own work grows with the value (docs/api.md).
_Budgeted = validators.extend(
    Draft202012Validator,
    {name: _counted(name, fn) for name, fn in Draft202012Validator.VALIDATORS.items()},
)
_plain_evolve = _Budgeted.evolve
_Budgeted.evolve = _evolve


@functools.cache
def _metaschema() -> Any:
    """The 2020-12 metaschema's validator, with the budget (check_schema's is without)."""
    return _Budgeted(Draft202012Validator.META_SCHEMA, format_checker=FORMATS)


class InputValidator:
    """A schema's validator. jsonschema is the judge: a value it finds invalid is refused,
    with its messages. For a schema made only of keywords both libraries read alike,
    jsonschema-rs answers first (~0.4 µs against ~28 µs for the built-ins' schemas: every
    ``ctx.tools`` call validates its input; docs/decisions/116-ctx-input-validation.md): a value it
    finds valid is valid; any other answer (invalid, or it could not take the value) goes to
    jsonschema."""

    __slots__ = ("_fast", "_ways", "enum_parts", "reference", "runaway")

    def __init__(self, schema: dict[str, Any]) -> None:
        self._fast: Any = None
        self.enum_parts = _enum_parts(schema)
        self.runaway: tuple[str, str] | None = None
        self._ways: int | None = None  # ways down from the root; None: unbounded (recursive)
        try:
            resolver, registry = registry_of(schema)
            if '"$ref"' in json.dumps(schema):
                graph = _Graph(schema, resolver)
                # Stored before saving refused them: no value is checked against such a one.
                self.runaway = _runaway(graph)
                if self.runaway is None:
                    self._ways = graph.paths_down(graph.loop[1])
            else:  # a tree: a way down to each subschema
                self._ways = len(_written_nodes(schema))
            # Resolved in the schema's own registry only (jsonschema's default adds the
            # bundled metaschemas, which a $ref could name: refused as never fetched).
            self.reference = _Budgeted(
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


def compile_validator(schema: dict[str, Any]) -> InputValidator:
    return InputValidator(schema)


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
        with _armed(steps, seconds):
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
