"""Request and response bodies as the OpenAPI document shows them."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from toolkiln.domain import limits, text
from toolkiln.domain.egress import ENTRY_PATTERN, MAX_RULE_CHARS, MAX_RULES
from toolkiln.domain.records import BUILTIN_NAMES
from toolkiln.domain.secrets import MAX_VALUE_CHARS as MAX_SECRET_CHARS
from toolkiln.domain.testcases import DEFAULT_CALLERS, MAX_CASE_NAME_CHARS, MAX_TEST_CASES

T = TypeVar("T")


class Body(BaseModel):
    """Request bodies refuse unknown fields and do not coerce types."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")


def checked(**rules: Any) -> dict[str, Any]:
    """JSON Schema keywords the document states for a field the domain checks itself.

    The domain reports every problem of a body at once (``invalid_tool`` lists them all);
    Pydantic would stop at the first field, so these limits are shown, not enforced here.
    Each one mirrors a rule in ``toolkiln.domain`` exactly.
    """
    return {"json_schema_extra": rules}


LABEL = checked(minLength=1, maxLength=limits.MAX_LABEL_CHARS, pattern=text.LABEL_PATTERN)
# An entry of an egress list or of a secret's hosts, stated as the domain checks it.
HOST_ENTRY = checked(minLength=1, maxLength=MAX_RULE_CHARS, pattern=ENTRY_PATTERN)
HostEntry = Annotated[str, Field(**HOST_ENTRY)]


def client_id() -> Any:
    """An optional id the client picks (tool_call_id, conversation_id, ...): enforced here."""
    return Field(
        None, min_length=1, max_length=limits.MAX_CALL_ID_CHARS, pattern=text.CLIENT_ID_PATTERN
    )


# The default of a patch field a client left out; never stored (model_dump(exclude_unset)).
ABSENT: Any = None


def _absent_not_null(schema: dict[str, Any]) -> None:
    """A patch's fields default to "unchanged", not to null: the document shows no default."""
    for prop in schema.get("properties", {}).values():
        prop.pop("default", None)


TIMEOUT = checked(minimum=limits.MIN_TIMEOUT_MS, maximum=limits.MAX_TIMEOUT_MS)
TOOL_NAME = checked(minLength=1, maxLength=limits.MAX_NAME_CHARS, pattern=text.TOOL_NAME_PATTERN)
DESCRIPTION = checked(maxLength=limits.MAX_DESCRIPTION_CHARS, pattern=text.NO_NUL_PATTERN)
STATUS_LINE = checked(maxLength=limits.MAX_STATUS_LINE_CHARS, pattern=text.NO_NUL_PATTERN)
CODE = checked(
    minLength=1,
    maxLength=limits.MAX_CODE_CHARS,
    pattern=text.NOT_BLANK_PATTERN,
)
EMAIL_ENTRY = checked(minLength=1, maxLength=254, pattern="^[^\\s@\\u0000]*@?[^\\s@\\u0000]*$")


def _whole_number(value: Any) -> Any:
    """JSON Schema's ``integer`` includes 350.0; strict mode would refuse it, so let it in."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer as JSON Schema means it: 350 and 350.0 alike, never "350" or true.
JsonInt = Annotated[int, BeforeValidator(_whole_number)]
VersionNumber = Annotated[int, Field(ge=1, le=limits.MAX_VERSION), BeforeValidator(_whole_number)]
# An id in a body (workspace_id, a tool's name in a call): no NUL, which PostgreSQL cannot
# even compare; an unknown id is a 404 as ever.
RefId = Annotated[str, Field(max_length=limits.MAX_CALL_ID_CHARS, pattern=text.NO_NUL_PATTERN)]
# A filter in a query (workspace_id=, event=, ...): the same rule, stated and enforced.
Filter = Annotated[str | None, Query(pattern=text.NO_NUL_PATTERN)]
# Paging query parameters of every listing.
Cursor = Annotated[str | None, Query(pattern=text.CURSOR_PATTERN)]
Limit = Annotated[int | None, Query(ge=1, le=limits.MAX_PAGE_SIZE)]


class WorkspaceIn(Body):
    name: str = Field(**LABEL)


class TokenIn(Body):
    workspace_id: RefId
    scopes: list[Literal["read", "write", "invoke", "admin"]] = Field(min_length=1)
    name: str | None = Field(None, **LABEL)


class PolicyPatch(Body):
    """A field left out keeps its value; null is refused (no policy field is nullable)."""

    model_config = ConfigDict(json_schema_extra=_absent_not_null)

    email_allowlist: list[Annotated[str, Field(**EMAIL_ENTRY)]] = Field(ABSENT, max_length=1000)
    builtins: list[Literal[BUILTIN_NAMES]] = Field(ABSENT)  # type: ignore[valid-type]
    max_timeout_ms: JsonInt = Field(ABSENT, **TIMEOUT)
    egress: list[HostEntry] = Field(
        ABSENT,
        max_length=MAX_RULES,
        description="Hosts a model's own http_request calls may reach (docs/egress.md).",
    )
    egress_private: bool = Field(
        ABSENT,
        description="Let requests reach private, loopback, link-local and CGNAT addresses.",
    )


SECRET_NAME = checked(minLength=1, maxLength=64, pattern="^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_VALUE = checked(
    minLength=1, maxLength=MAX_SECRET_CHARS, pattern="^[^\\u0000-\\u001f\\u007f]*$"
)
SECRET_HOSTS = checked(minItems=1, maxItems=MAX_RULES)


class SecretIn(Body):
    name: str = Field(**SECRET_NAME)
    value: str = Field(**SECRET_VALUE, description="Written once, never shown again.")
    hosts: list[HostEntry] = Field(
        **SECRET_HOSTS,
        description="The hosts the value may be sent to, written as in an egress list.",
    )


class SecretPatch(Body):
    """A field left out keeps its value."""

    model_config = ConfigDict(json_schema_extra=_absent_not_null)

    value: str = Field(ABSENT, **SECRET_VALUE)
    hosts: list[HostEntry] = Field(ABSENT, **SECRET_HOSTS)


class SecretOut(BaseModel):
    name: str
    hosts: list[str]
    created_at: str
    updated_at: str
    last_used_at: str | None


class Expect(Body):
    """A partial Result: every key given must equal the run's (``raw_data`` as JSON)."""

    status: Literal["ok", "error"] | None = None
    message: str | None = None
    raw_data: Any = None
    error_code: str | None = None


class TestCaseIn(Body):
    __test__ = False  # not a pytest class, whatever its name
    name: str = Field(min_length=1, max_length=MAX_CASE_NAME_CHARS)
    input: dict[str, Any] = Field(default_factory=dict)
    expect: Expect = Field(default_factory=Expect)


Caller = Literal["direct", "code"]


def _cases() -> Any:
    return Field(
        default_factory=list,
        max_length=MAX_TEST_CASES,
        description="Run before the version is stored; see allow_failing_tests.",
    )


def _callers() -> Any:
    return Field(
        default_factory=lambda: list(DEFAULT_CALLERS),
        min_length=1,
        description="Where the tool may be called from: directly, and from code (code mode).",
    )


def _egress() -> Any:
    return Field(
        default_factory=list,
        max_length=MAX_RULES,
        description="Hosts http_request may reach from this tool's code: 'api.example.com', "
        "'*.example.org', 'api.example.com:8443' (docs/egress.md). Empty: none.",
    )


def _allow_failing() -> Any:
    return Field(
        False, description="Store the version even when its test cases fail (they are not run)."
    )


class ToolFields(Body):
    description: str | None = Field(None, **DESCRIPTION)
    parameters: dict[str, Any] | None = None
    input_schema: dict[str, Any] | None = None
    execution_message_description: str | None = Field(None, **STATUS_LINE)
    enable_globally: bool = False
    timeout_ms: JsonInt = Field(limits.DEFAULT_TIMEOUT_MS, **TIMEOUT)
    test_cases: list[TestCaseIn] = _cases()
    allowed_callers: list[Caller] = _callers()
    egress: list[HostEntry] = _egress()
    allow_failing_tests: bool = _allow_failing()


class ToolCreate(ToolFields):
    workspace_id: RefId
    name: str = Field(**TOOL_NAME)
    language: Literal["python", "javascript"]
    code: str = Field(**CODE)


class ToolPatch(Body):
    """A field left out keeps its value. ``null`` is refused (422) unless the Tool's field is
    nullable: ``parameters: null`` means no parameters, ``execution_message_description: null``
    clears the status line."""

    model_config = ConfigDict(json_schema_extra=_absent_not_null)

    name: str = Field(ABSENT, **TOOL_NAME)
    description: str = Field(ABSENT, **DESCRIPTION)
    language: Literal["python", "javascript"] = Field(ABSENT)
    code: str = Field(ABSENT, **CODE)
    parameters: dict[str, Any] | None = None
    input_schema: dict[str, Any] = Field(ABSENT)
    execution_message_description: str | None = Field(ABSENT, **STATUS_LINE)
    enable_globally: bool = Field(ABSENT)
    timeout_ms: JsonInt = Field(ABSENT, **TIMEOUT)
    # Not nullable: left out they stay as they are; a null is refused.
    test_cases: list[TestCaseIn] = _cases()
    allowed_callers: list[Caller] = _callers()
    egress: list[HostEntry] = _egress()
    allow_failing_tests: bool = _allow_failing()
    base_version: JsonInt = Field(
        ABSENT,
        ge=1,
        le=limits.MAX_VERSION,
        description=(
            "The version this change was made from: if the tool is at another version, the "
            "PATCH is refused with 409 edit_conflict and nothing changes."
        ),
    )


class EnableIn(Body):
    """Enabling takes no fields; a body, if any, must be an empty object."""


class DisableIn(Body):
    reason: str | None = Field(None, max_length=500)


class Workspace(BaseModel):
    id: str
    name: str
    created_at: str


class Token(BaseModel):
    id: str
    workspace_id: str
    scopes: list[str]
    name: str | None
    created_at: str
    revoked_at: str | None = None


class TokenIssued(Token):
    token: str = Field(description="The secret value; it appears only in this answer.")


class Policy(BaseModel):
    email_allowlist: list[str]
    builtins: list[str]
    max_timeout_ms: int
    egress: list[str]
    egress_private: bool


class SchemaWarning(BaseModel):
    field: str
    message: str


class DefinitionOut(BaseModel):
    """What a version runs (``domain.tools.Definition``), as Tool and ToolVersion show it."""

    language: str
    code: str
    description: str
    parameters: dict[str, Any] | None
    input_schema: dict[str, Any]
    timeout_ms: int
    test_cases: list[dict[str, Any]]
    allowed_callers: list[str]
    egress: list[str]


class Tool(DefinitionOut):
    id: str
    workspace_id: str
    name: str
    execution_message_description: str | None
    enable_globally: bool
    status: Literal["active", "disabled"]
    disabled_reason: str | None
    usage_count: int
    failure_count: int
    last_error: str | None
    validated: bool
    warnings: list[SchemaWarning] = Field(
        description="How tool lists offer this schema to model providers, when not as is: "
        "top-level combinators left out, or OpenAI strict mode off (docs/agents.md)."
    )
    version: int
    created_at: str
    updated_at: str


class ToolVersion(DefinitionOut):
    tool_id: str
    version: int
    created_at: str


class AuditRow(BaseModel):
    id: str
    workspace_id: str
    tool_call_id: str | None
    tool_id: str | None
    agent_id: str | None
    source: str
    event: str
    data: Any
    created_at: str


class StatsBucket(BaseModel):
    calls: int
    failures: int
    failures_by_code: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None


class StatsSlot(StatsBucket):
    start: str = Field(description="The bucket's start, UTC (ISO 8601).")


class ToolStats(BaseModel):
    tool_id: str
    window: Literal["1h", "24h", "7d"]
    bucket_seconds: int
    from_: str = Field(alias="from", description="The first bucket's start, UTC.")
    to: str = Field(description="The end of the last bucket, UTC.")
    buckets: list[StatsSlot]
    total: StatsBucket

    model_config = {"populate_by_name": True}


class One(BaseModel, Generic[T]):
    data: T


class Many(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: str | None = None


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


# The answer of a route that may start long work (a generation, test runs, a program,
# run_code) when the workspace's share of it is in use (services/places.py).
LONG_WORK: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorEnvelope,
        "description": "too_many_requests: the workspace (or the service) has all its places "
        "for long work in use; try again after Retry-After seconds.",
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before trying again.",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    }
}


class InvokeIn(Body):
    input: Any = Field(default_factory=dict)
    agent_id: str | None = client_id()
    conversation_id: str | None = client_id()
    tool_call_id: str | None = client_id()
    power_user_id: str | None = client_id()


class ToolTest(ToolCreate):
    input: Any = Field(default_factory=dict)


class RunCodeIn(Body):
    language: Literal["python", "javascript"]
    code: str = Field(min_length=1, max_length=limits.MAX_CODE_CHARS)
    input: dict[str, Any] = Field(default_factory=dict)
    tool_call_id: str | None = client_id()


class ResultError(BaseModel):
    code: str
    message: str
    details: Any = None


class Result(BaseModel):
    tool_call_id: str
    tool_id: str | None
    version: int | None
    status: Literal["ok", "error"]
    message: str | None
    raw_data: Any
    llm: Any
    render: Any
    interactive: Any
    error: ResultError | None
    duration_ms: float
    ctx_calls: int
    logs: dict[str, str] = Field(description="Captured stdout and stderr, 64 KiB each.")


class StoredResult(Result):
    audit: list[AuditRow]


class Runtime(BaseModel):
    available: bool
    entrypoints: list[dict[str, str]]
    return_contract: str
    ctx: list[str]
    limits: dict[str, Any]
    isolation: dict[str, Any]
    dependencies: list[dict[str, str]]


class Runtimes(BaseModel):
    python: Runtime
    javascript: Runtime


class CaseReport(BaseModel):
    name: str
    passed: bool
    result: Result
    mismatch: list[dict[str, Any]] | None = Field(
        description="Each key of expect the run did not match: {field, expected, actual}."
    )


class TestRun(BaseModel):
    __test__ = False
    version: int
    passed: int
    failed: int
    cases: list[CaseReport]


class GenerateIn(Body):
    workspace_id: RefId
    description: str = Field(
        min_length=1, max_length=4000, **checked(pattern=text.NOT_BLANK_PATTERN)
    )
    language: Literal["python", "javascript"] = "python"
    name: str | None = Field(None, **TOOL_NAME)


class Example(BaseModel):
    input: dict[str, Any]
    expected: Any = Field(
        None, description="As the model gave it; see the test case for how it is read."
    )
    result: Result


class Draft(BaseModel):
    """A generated tool that passed validation and ran every example; nothing is saved."""

    name: str
    description: str
    language: str
    parameters: dict[str, Any] | None
    input_schema: dict[str, Any]
    code: str
    execution_message_description: str | None
    egress: list[str] = Field(description="Hosts the model proposes the code may reach.")
    examples: list[Example]
    test_cases: list[dict[str, Any]]
    attempts: int
    usage: dict[str, int] = Field(
        description="requests, prompt_tokens, completion_tokens and sandbox_runs it took."
    )
