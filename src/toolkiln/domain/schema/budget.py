"""The bounds of one check (a value's, or a schema's on save): keyword evaluations counted by
a jsonschema validator made for it, and the schema's regular expressions searched by the
service's searcher within the check's time."""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, Protocol

from jsonschema import Draft202012Validator, FormatChecker, _keywords, _utils, validators

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
# (sandbox/patterns.py) when the check is given that searcher: a tool author's schema is; the
# service's own schemas, whose patterns are its own, are searched by ``re`` in the thread.
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
    """The check this thread is running, while ``armed``: jsonschema's keywords reach it only
    through this, as they are called with no context of the check."""

    armed = False  # only while armed: input_problems, and check_schema's compiles
    left = STEPS
    until = 0.0  # time.monotonic() when the pattern searches and compiles must have ended
    searcher: Searcher | None = None  # where this check searches its patterns


_BUDGET = _Budget()


@contextlib.contextmanager
def armed(steps: int, seconds: float, searcher: Searcher | None) -> Iterator[None]:
    """This thread's keyword evaluations and regular expressions bounded until the end, the
    schema's patterns searched by ``searcher`` (None: by ``re``, in this thread)."""
    _BUDGET.left, _BUDGET.until = steps, time.monotonic() + seconds
    _BUDGET.searcher, _BUDGET.armed = searcher, True
    try:
        yield
    finally:
        _BUDGET.searcher, _BUDGET.armed = None, False


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


def on_behalf_of(searcher: Searcher | None, workspace_id: str) -> Searcher | None:
    """``searcher`` for one workspace's schemas and values, where it shares its work between
    workspaces (``for_workspace``: sandbox/patterns.py; tests/security/test_pattern_share.py);
    else ``searcher`` itself."""
    bind = getattr(searcher, "for_workspace", None)
    return bind(workspace_id) if bind is not None else searcher


_INLINE_MULTILINE = re.compile(r"\(\?[aiLmsux-]*m")


@functools.lru_cache(maxsize=4096)
def ecma_end(pattern: str) -> str:
    r"""A schema's pattern is an ECMA-262 regular expression, where ``$`` (without the ``m``
    flag, which a schema cannot set) matches only at the end of the text; ``re``'s also matches
    before a final newline, and would let ``"abc\n"`` through ``^[a-z]+$``. Each ``$`` outside a
    character class becomes ``\Z``; a pattern that sets ``re``'s own multiline flag inline
    keeps its ``$``."""
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
    """What ``Budgeted``'s searching keywords call ``re``: every search of a schema's patterns
    (``pattern``, ``patternProperties``, and ``additionalProperties`` and
    ``unevaluatedProperties``, which consult them) goes to the check's searcher, with its
    time left; without one (the service's own schemas), or outside a check, it is ``re``'s. A
    test checks that no other search is left in jsonschema's keywords
    (tests/security/test_schema_patterns.py)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        searcher = _BUDGET.searcher
        if isinstance(pattern, str):
            pattern = ecma_end(pattern)
        if not _BUDGET.armed or searcher is None or flags:
            return re.search(pattern, string, flags)
        if not isinstance(pattern, str) or not isinstance(string, str):
            # a pattern where no keyword the metaschema checks reads it, reached by $ref
            raise Unmatchable(f"{str(pattern)[:200]!r} is not a regular expression")
        return True if searcher.search(pattern, string, _BUDGET.until) else None


def _with_globals(fn: Any, names: dict[str, Any]) -> Any:
    """``fn``'s code with ``names`` as its module's globals: jsonschema's module stays as it is."""
    copy = types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return copy


# The keywords that search a schema's patterns, as ``Budgeted`` evaluates them: jsonschema's own
# functions, each run with ``_SearchingRe`` as its ``re`` (``pattern`` and
# ``patternProperties`` search themselves; ``additionalProperties`` and
# ``unevaluatedProperties`` through two helpers of jsonschema._utils, copied the same way).
# jsonschema itself is not changed, for its other users in the process (the MCP SDK's). A
# test fails when jsonschema searches anywhere else (tests/security/test_schema_patterns.py;
# docs/decisions/401-jsonschema-searches-through-copies.md).
SEARCHING_RE = _SearchingRe()
SEARCHING_HELPERS = ("find_additional_properties", "find_evaluated_property_keys_by_schema")
_UTILS: dict[str, Any] = {**vars(_utils), "re": SEARCHING_RE}
_UTILS.update({name: _with_globals(getattr(_utils, name), _UTILS) for name in SEARCHING_HELPERS})
_KEYWORDS: dict[str, Any] = {**vars(_keywords), "re": SEARCHING_RE}
_KEYWORDS.update({name: _UTILS[name] for name in SEARCHING_HELPERS})
SEARCHING_KEYWORDS = {
    name: _with_globals(getattr(_keywords, name), _KEYWORDS)
    for name in ("pattern", "patternProperties", "additionalProperties", "unevaluatedProperties")
}


def is_regex(instance: object) -> bool:
    """``format: regex``. A caller's text (while input_problems checks a value) is compiled by
    the searcher within the value's time (``re`` can take quadratic time: a long ``x|x``);
    anything ``re.compile`` raises, not only ``re.error`` (OverflowError for a count past
    2**32, RecursionError for deep nesting), makes it no regex, on save as for inputs."""
    if not isinstance(instance, str):
        return True
    searcher = _BUDGET.searcher
    if _BUDGET.armed and searcher is not None:
        return searcher.compiles(instance, _BUDGET.until)
    try:
        re.compile(instance)
    except (re.error, OverflowError, RecursionError, ValueError, MemoryError):
        return False
    return True


FORMATS = FormatChecker()
FORMATS.checkers = {**Draft202012Validator.FORMAT_CHECKER.checkers}
FORMATS.checks("regex")(is_regex)


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
Budgeted = validators.extend(
    Draft202012Validator,
    {
        name: _counted(name, SEARCHING_KEYWORDS.get(name, fn))
        for name, fn in Draft202012Validator.VALIDATORS.items()
    },
)
_plain_evolve = Budgeted.evolve
Budgeted.evolve = _evolve


@functools.cache
def metaschema() -> Any:
    """The 2020-12 metaschema's validator, with the budget (check_schema's is without)."""
    return Budgeted(Draft202012Validator.META_SCHEMA, format_checker=FORMATS)
