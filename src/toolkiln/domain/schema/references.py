"""Where a schema's ``$ref``s lead: the subschemas validation reaches, loops that never apply
to a part of the value, fan-out, and a registry that never fetches."""

from __future__ import annotations

import functools
import json
from typing import Any

from referencing import Registry, Resource
from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unretrievable
from referencing.jsonschema import DRAFT202012

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


def written_nodes(schema: dict[str, Any]) -> list[_Edge]:
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
    for node, path in written_nodes(schema):
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


class Graph:
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
    graph = Graph(schema, registry_of(schema)[0])
    found = runaway_in(graph)
    if found is None and graph.dangling:
        # Refused on save only: a schema stored before still takes the values that never
        # reach the reference (and refuses those that do, as it always did).
        return ".".join(graph.dangling[0]), DANGLING_MESSAGE
    return found


def runaway_in(graph: Graph) -> tuple[str, str] | None:
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
