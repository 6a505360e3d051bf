"""What a tool's input schema must be to be saved: a valid 2020-12 schema with an object at
its root, within the size and depth caps, its patterns regular expressions, and no ``$ref``
that makes checking a value run without end."""

from __future__ import annotations

import json
from typing import Any

from toolkiln.domain.limits import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from toolkiln.domain.problems import Problem, json_depth, problem, text_problems
from toolkiln.domain.schema.budget import (
    SAVE_SECONDS,
    SAVE_STEPS,
    SAVE_STEPS_MESSAGE,
    OutOfSteps,
    OutOfTime,
    Searcher,
    Unmatchable,
    armed,
    is_regex,
    metaschema,
)
from toolkiln.domain.schema.parameters import DIALECT
from toolkiln.domain.schema.references import runaway, written_nodes


def _metaschema_problem(schema: dict[str, Any], field: str) -> Problem | None:
    """The metaschema's verdict (its ``format: regex`` included), then what this service asks
    of a schema's shape: an object root, ``$schema`` at the root only, and
    ``patternProperties`` whose patterns joined are a regex."""
    # As Draft202012Validator.check_schema (its first error), by a validator that counts
    # its steps: unbudgeted, 4,000 empty properties (51 KB) held a thread 3-7 s.
    error = next(iter(metaschema().iter_errors(schema)), None)
    if error is not None:
        path = ".".join(str(p) for p in error.path)
        return problem(f"{field}.{path}" if path else field, error.message)
    if schema.get("type") != "object":
        return problem(f"{field}.type", 'the root must be {"type": "object", ...}')
    below = [p for n, p in written_nodes(schema) if n is not schema and "$schema" in n]
    if below:  # a dialect of its own would be validated by a validator without a budget
        return problem(".".join([field, *below[0], "$schema"]), "is allowed at the root only")
    for node, at in written_nodes(schema):
        keys = node.get("patternProperties") if isinstance(node, dict) else None
        if isinstance(keys, dict) and len(keys) > 1 and not is_regex("|".join(keys)):
            # additionalProperties searches them as one pattern: a flag such as (?x) then
            # stands in the middle, which re refuses
            why = "joined with | (as additionalProperties reads them), its patterns are no regex"
            return problem(".".join([field, *at, "patternProperties"]), why)
    return None


def check_schema(
    schema: Any, field: str = "input_schema", *, searcher: Searcher | None
) -> list[Problem]:
    """A valid 2020-12 schema with an object at its root, within the size and depth caps.
    ``searcher``: where the author's patterns are compiled (a tool's schema needs one)."""
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
        with armed(SAVE_STEPS, SAVE_SECONDS, searcher):
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
