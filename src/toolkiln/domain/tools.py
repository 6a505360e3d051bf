"""Custom tools: the definition a version runs, its rules, and the record types."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from toolkiln.domain import limits
from toolkiln.domain.analysis import Analysis
from toolkiln.domain.egress import check_rules
from toolkiln.domain.problems import Problem, problem, text_problems
from toolkiln.domain.schema.budget import Searcher
from toolkiln.domain.schema.parameters import EMPTY_SCHEMA, parameters_to_schema
from toolkiln.domain.schema.saving import check_schema
from toolkiln.domain.testcases import DEFAULT_CALLERS, check_callers, check_test_cases

NAME_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
AUTO_DISABLE_AFTER = 3
AUTO_DISABLE_REASON = "automatic, after 3 consecutive failures"


def _empty_schema() -> dict[str, Any]:
    return dict(EMPTY_SCHEMA)


def _all_callers() -> list[str]:
    return list(DEFAULT_CALLERS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Definition:
    """What a version of a tool runs. Every field is versioned: a change to any of them makes
    a new version, each version keeps its own copy, and the storage columns, the API bodies
    and the diffs are made from this list of fields (a new versioned field is a field here,
    a column in ``storage/tables.py`` with its migration, and a field in ``api/models.py``)."""

    language: str
    code: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=_empty_schema)
    timeout_ms: int = limits.DEFAULT_TIMEOUT_MS
    test_cases: list[dict[str, Any]] = field(default_factory=list)
    allowed_callers: list[str] = field(default_factory=_all_callers)
    egress: list[str] = field(default_factory=list)  # hosts http_request may reach

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Definition:
        """The definition among ``values`` (a row, a body, a draft's fields): the keys of
        this value are picked, any other is ignored."""
        return cls(**{k: values[k] for k in VERSIONED_FIELDS if k in values})

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, lists copied (a caller may change what it gets)."""
        values = {k: getattr(self, k) for k in VERSIONED_FIELDS}
        return {k: list(v) if isinstance(v, list) else v for k, v in values.items()}


VERSIONED_FIELDS = tuple(f.name for f in fields(Definition))


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDraft:
    """A tool as a client sends it, before validation: its name, its unversioned settings,
    and its definition, whose input schema is the one given or is made from ``parameters``
    (``schema_given``: the client sent an input schema)."""

    name: str
    definition: Definition
    parameters: dict[str, Any] | None = None
    schema_given: bool = False
    execution_message_description: str | None = None
    enable_globally: bool = False

    @classmethod
    def of(cls, **values: Any) -> ToolDraft:
        """A draft from fields as a client names them (``input_schema`` None or absent: not
        given)."""
        schema = values.pop("input_schema", None)
        definition = Definition.of(values)
        if schema is not None:
            definition = replace(definition, input_schema=schema)
        rest = {k: v for k, v in values.items() if k not in VERSIONED_FIELDS}
        return cls(definition=definition, schema_given=schema is not None, **rest)

    def as_fields(self) -> dict[str, Any]:
        """The draft as a create body names its fields."""
        settings = {k: getattr(self, k) for k in DRAFT_SETTINGS}
        return {**settings, **self.definition.as_dict()}

    def timed(self, timeout_ms: int) -> ToolDraft:
        """This draft with another timeout (test cases and examples share a time budget)."""
        return replace(self, definition=replace(self.definition, timeout_ms=timeout_ms))


# A draft's fields besides its definition's, as a client names them.
DRAFT_SETTINGS = ("name", "parameters", "execution_message_description", "enable_globally")
DRAFT_FIELDS = (*DRAFT_SETTINGS, *VERSIONED_FIELDS)


@dataclass(slots=True)
class Tool:
    """A stored custom tool at its current version."""

    id: str
    workspace_id: str
    name: str
    definition: Definition
    execution_message_description: str | None
    enable_globally: bool
    status: str
    disabled_reason: str | None
    usage_count: int
    failure_count: int
    last_error: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    seq: int = 0

    def at(self, version: ToolVersion) -> Tool:
        """This tool running a pinned version: counters and status are the tool's, the
        definition the version's."""
        return replace(self, definition=version.definition, version=version.version)

    def snapshot(self) -> ToolVersion:
        """The version this tool is at, as stored in its history."""
        return ToolVersion(self.id, self.version, self.definition, self.updated_at)


@dataclass(frozen=True, slots=True)
class ToolVersion:
    """An immutable snapshot of what a version of a tool runs."""

    tool_id: str
    version: int
    definition: Definition
    created_at: datetime


def check_name(name: str) -> list[Problem]:
    if len(name) > limits.MAX_NAME_CHARS:
        return [problem("name", f"must be at most {limits.MAX_NAME_CHARS} characters")]
    if not NAME_RE.fullmatch(name):
        return [problem("name", "must be lowercase kebab-case: a-z, 0-9 and single hyphens")]
    return []


def validate_draft(
    draft: ToolDraft, max_timeout_ms: int, analysis: Analysis, searcher: Searcher | None
) -> tuple[Definition, list[Problem]]:
    """Every problem of a draft at once, and the definition it stands for: its input schema
    in JSON Schema form, its test cases as checked. ``analysis``: of the draft's language and
    code (a ``CodeAnalyser``'s answer), whose problems are the language's and the code's.
    ``searcher``: where the schema's own patterns are compiled (domain/schema/budget.py)."""
    d = draft.definition
    problems = check_name(draft.name)
    if len(d.description) > limits.MAX_DESCRIPTION_CHARS:
        problems.append(
            problem("description", f"must be at most {limits.MAX_DESCRIPTION_CHARS} characters")
        )
    problems += text_problems("description", d.description)
    status_line = draft.execution_message_description or ""
    if len(status_line) > limits.MAX_STATUS_LINE_CHARS:
        problems.append(
            problem(
                "execution_message_description",
                f"must be at most {limits.MAX_STATUS_LINE_CHARS} characters",
            )
        )
    problems += text_problems("execution_message_description", status_line)
    ceiling = min(max_timeout_ms, limits.MAX_TIMEOUT_MS)
    if not limits.MIN_TIMEOUT_MS <= d.timeout_ms <= ceiling:
        problems.append(
            problem("timeout_ms", f"must be between {limits.MIN_TIMEOUT_MS} and {ceiling}")
        )
    problems += analysis.problems
    problems += check_test_cases(d.test_cases)[1]
    problems += check_callers(d.allowed_callers)
    problems += check_rules(d.egress)
    schema, field, schema_problems = _schema_of(draft)
    if field is not None:
        schema_problems = check_schema(schema, field, searcher=searcher)
    return _definition(draft, schema), problems + schema_problems


def definition_of(draft: ToolDraft) -> Definition:
    """The definition a valid draft stands for: its input schema in JSON Schema form, its
    test cases as checked."""
    return _definition(draft, _schema_of(draft)[0])  # checked when it was validated


def _definition(draft: ToolDraft, schema: dict[str, Any]) -> Definition:
    d = draft.definition
    cases = check_test_cases(d.test_cases)[0]
    return replace(
        d,
        input_schema=schema,
        test_cases=[dict(c) for c in cases],
        allowed_callers=list(d.allowed_callers),
    )


def _schema_of(draft: ToolDraft) -> tuple[dict[str, Any], str | None, list[Problem]]:
    """The draft's input schema; the field it was given as, when it is still to be checked
    (``check_schema``); and the problems found making it."""
    given = draft.definition.input_schema
    if draft.parameters is not None and draft.schema_given:
        msg = "give either parameters or input_schema, not both"
        return _empty_schema(), None, [problem("input_schema", msg)]
    if draft.schema_given:
        return given, "input_schema", []
    if draft.parameters is not None:
        schema, problems = parameters_to_schema(draft.parameters)
        if problems:
            return _empty_schema(), None, problems
        return schema, "parameters", []
    return _empty_schema(), None, []
