"""Custom tools: the definition rules, what makes a new version, and the record types."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from toolkiln.domain import limits
from toolkiln.domain.analysis import Analysis
from toolkiln.domain.problems import Problem, problem, text_problems
from toolkiln.domain.schema import EMPTY_SCHEMA, check_schema, parameters_to_schema
from toolkiln.domain.testcases import DEFAULT_CALLERS, check_callers, check_test_cases

NAME_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
VERSIONED_FIELDS = (
    "code",
    "input_schema",
    "description",
    "timeout_ms",
    "language",
    "test_cases",
    "allowed_callers",
)
AUTO_DISABLE_AFTER = 3
AUTO_DISABLE_REASON = "automatic, after 3 consecutive failures"


@dataclass(slots=True)
class ToolDraft:
    """A tool definition as a client sends it, before or after validation."""

    name: str
    language: str
    code: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    input_schema: dict[str, Any] | None = None
    execution_message_description: str | None = None
    enable_globally: bool = False
    timeout_ms: int = limits.DEFAULT_TIMEOUT_MS
    test_cases: list[Any] = field(default_factory=list)
    allowed_callers: list[str] = field(default_factory=lambda: list(DEFAULT_CALLERS))


@dataclass(slots=True)
class Tool:
    """A stored custom tool at its current version."""

    id: str
    workspace_id: str
    name: str
    description: str
    language: str
    code: str
    input_schema: dict[str, Any]
    execution_message_description: str | None
    enable_globally: bool
    timeout_ms: int
    status: str
    disabled_reason: str | None
    usage_count: int
    failure_count: int
    last_error: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    seq: int = 0
    test_cases: list[dict[str, Any]] = field(default_factory=list)
    allowed_callers: list[str] = field(default_factory=lambda: list(DEFAULT_CALLERS))

    def at(self, version: ToolVersion) -> Tool:
        """This tool running a pinned version: counters and status are the tool's, code,
        schema, language, description and timeout the version's."""
        return replace(
            self,
            code=version.code,
            input_schema=version.input_schema,
            timeout_ms=version.timeout_ms,
            language=version.language,
            description=version.description,
            version=version.version,
            test_cases=list(version.test_cases),
            allowed_callers=list(version.allowed_callers),
        )


@dataclass(slots=True)
class ToolVersion:
    """An immutable snapshot of what a version of a tool runs."""

    tool_id: str
    version: int
    language: str
    code: str
    description: str
    input_schema: dict[str, Any]
    timeout_ms: int
    created_at: datetime
    test_cases: list[dict[str, Any]] = field(default_factory=list)
    allowed_callers: list[str] = field(default_factory=lambda: list(DEFAULT_CALLERS))


def check_name(name: str) -> list[Problem]:
    if len(name) > limits.MAX_NAME_CHARS:
        return [problem("name", f"must be at most {limits.MAX_NAME_CHARS} characters")]
    if not NAME_RE.fullmatch(name):
        return [problem("name", "must be lowercase kebab-case: a-z, 0-9 and single hyphens")]
    return []


def validate_draft(
    draft: ToolDraft, max_timeout_ms: int, analysis: Analysis
) -> tuple[dict[str, Any], list[Problem]]:
    """Every problem of a definition at once, and its input schema in JSON Schema form.
    ``analysis``: of the draft's language and code (a ``CodeAnalyser``'s answer), whose
    problems are the language's and the code's."""
    problems = check_name(draft.name)
    if len(draft.description) > limits.MAX_DESCRIPTION_CHARS:
        problems.append(
            problem("description", f"must be at most {limits.MAX_DESCRIPTION_CHARS} characters")
        )
    problems += text_problems("description", draft.description)
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
    if not limits.MIN_TIMEOUT_MS <= draft.timeout_ms <= ceiling:
        problems.append(
            problem("timeout_ms", f"must be between {limits.MIN_TIMEOUT_MS} and {ceiling}")
        )
    problems += analysis.problems
    problems += check_test_cases(draft.test_cases)[1]
    problems += check_callers(draft.allowed_callers)
    schema, schema_problems = _schema_of(draft)
    return schema, problems + schema_problems


def schema_of(draft: ToolDraft) -> dict[str, Any]:
    """The input schema of a valid draft, in JSON Schema form."""
    return _schema_of(draft)[0]


def _schema_of(draft: ToolDraft) -> tuple[dict[str, Any], list[Problem]]:
    if draft.parameters is not None and draft.input_schema is not None:
        msg = "give either parameters or input_schema, not both"
        return EMPTY_SCHEMA, [problem("input_schema", msg)]
    if draft.input_schema is not None:
        return draft.input_schema, check_schema(draft.input_schema)
    if draft.parameters is not None:
        schema, problems = parameters_to_schema(draft.parameters)
        if problems:
            return EMPTY_SCHEMA, problems
        return schema, check_schema(schema, "parameters")
    return dict(EMPTY_SCHEMA), []
