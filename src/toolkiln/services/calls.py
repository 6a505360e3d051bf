"""What a call is before the router takes it.

What a request says about its call (``CallContext``: the ids the client gave, whether a model
or the API calls, and the checks those ids pass): every transport (REST, MCP) and every use
case that starts a call builds its call's ``Caller`` from it. What is called (a ``Request``:
a tool by name, a ``ctx.tools`` call from code, a stored tool already read, a draft), handed
to the router's one entrance, ``Router.call(origin, request)``, and what it answers
(``Answer``: the ``Result`` and the one conversion to what ``ctx.tools`` resolves to)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict, InvalidRequest
from toolkiln.domain.execution import Code
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MAX_CALL_ID_CHARS
from toolkiln.domain.origin import Caller, Source
from toolkiln.domain.problems import Problem, problem
from toolkiln.domain.results import Result
from toolkiln.domain.text import is_client_id
from toolkiln.domain.tools import Tool
from toolkiln.services.ports import UnitOfWork

CLIENT_IDS = ("tool_call_id", "agent_id", "conversation_id", "power_user_id")
Kind = Literal["builtin", "run_code", "custom", "refused"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a request says about its call: ids given by the client, and its source."""

    tool_call_id: str | None = None
    agent_id: str | None = None
    conversation_id: str | None = None
    power_user_id: str | None = None
    source: Source = "api"

    @classmethod
    def of(
        cls,
        tool_call_id: str | None = None,
        agent_id: str | None = None,
        conversation_id: str | None = None,
        power_user_id: str | None = None,
    ) -> CallContext:
        """A request's ids; a call that names an agent is a model's (source ``llm``), any
        other the API's own (``api``)."""
        source: Source = "llm" if agent_id else "api"
        return cls(tool_call_id, agent_id, conversation_id, power_user_id, source)

    def for_agent(self, agent_id: str) -> CallContext:
        """The call as one of the agent ``agent_id``'s tool calls: a model's."""
        return replace(self, agent_id=agent_id, source="llm")

    def call_id(self) -> str:
        """The client's ``tool_call_id``, or a new one."""
        return self.tool_call_id or new_id()

    def call_id_in(self, tx: UnitOfWork, workspace_id: str) -> str:
        """The call's id, read in ``tx``: the client's if it was not used before in the
        workspace (else 409 ``duplicate_tool_call_id``), or a new one."""
        if self.tool_call_id is not None and tx.calls.exists(workspace_id, self.tool_call_id):
            raise duplicate_call_id()
        return self.call_id()

    def caller(
        self, principal: Principal, workspace_id: str, *, agent_name: str | None = None
    ) -> Caller:
        return Caller(
            principal,
            workspace_id,
            self.source,
            self.agent_id,
            agent_name,
            self.conversation_id,
            self.power_user_id,
        )


def check_ids(who: CallContext) -> None:
    """Ids a client gives are printable text of at most 128 characters, or refused."""
    problems: list[Problem] = []
    for name in CLIENT_IDS:
        value = getattr(who, name)
        if value is None:
            continue
        if not is_client_id(value):
            problems.append(problem(name, f"1 to {MAX_CALL_ID_CHARS} printable ASCII characters"))
    if problems:
        raise InvalidRequest(f"{problems[0]['field']} is not a valid id.", problems)


@contextlib.contextmanager
def raced_call_id(who: CallContext) -> Iterator[None]:
    """Two requests with the same client ``tool_call_id`` at once both pass the check before
    their runs (it is no reservation: both run); the later record then meets the earlier's
    unique key. That answer is ``duplicate_tool_call_id`` too, not a generic conflict."""
    try:
        yield
    except Conflict as exc:
        if who.tool_call_id is not None and exc.code == "conflict":
            raise duplicate_call_id() from exc
        raise


def duplicate_call_id() -> Conflict:
    return Conflict(
        "That tool_call_id was used before in this workspace.",
        [{"field": "tool_call_id", "message": "already used"}],
        code="duplicate_tool_call_id",
    )


# -- what is called


class Found(NamedTuple):
    """A custom tool a name means to a caller (None: none it may reach), and when the
    statement that read it was sent (``time.monotonic()``: its status is that old)."""

    tool: Tool | None
    read_at: float


@dataclass(frozen=True, slots=True)
class ByName:
    """A root call of a tool by the name its caller gives: a built-in, ``run_code``, an
    agent's ``run_program``, or a custom tool (its name or ``custom_{id}``, within what
    ``origin.offer`` offers). ``found``: what ``Router.find`` made of ``name`` in the
    caller's own read, so that the call reads nothing more before its run."""

    name: str
    payload: Any
    found: Found | None = None


@dataclass(frozen=True, slots=True)
class FromCode:
    """A ``ctx.tools`` call made by the code of the run the origin belongs to: it spends the
    call's shared budget, and answers what ``ctx.tools`` resolves to (``Answer.value``)."""

    name: str
    payload: Any


@dataclass(frozen=True, slots=True)
class StoredTool:
    """A stored tool its caller read already (maybe at a pinned version: the counters are
    the tool's, code and schema the version's). ``read_at``: when the statement that read
    it was sent (``time.monotonic()``, after its transaction began): the status it saw is
    the one the run's admission judges (services/admission.py)."""

    tool: Tool
    payload: Any
    read_at: float


@dataclass(frozen=True, slots=True)
class DraftCode:
    """Unsaved code run once (a test run, a test case, a generated example): nothing is
    stored or counted, neither the draft nor any custom tool it reaches, but the audit rows
    of its ctx calls are written. Under a stored tool's own test case (``origin.tool_id``)
    it leaves a ``tool.invoked`` row marked as a test run too."""

    code: Code
    schema: dict[str, Any]
    payload: Any
    name: str


Request = ByName | FromCode | StoredTool | DraftCode


@dataclass(frozen=True, slots=True)
class Answer:
    """What a call answered, and as what kind of tool it was routed."""

    kind: Kind
    result: Result

    def value(self) -> Any:
        """What ``ctx.tools`` resolves to: the one conversion from a Result.

        Errors become the envelope ``{"error": code, "details"}`` (a nested tool's details
        carry its whole error and its ``tool_call_id``); a built-in resolves to its value,
        ``run_code`` to its Result, a custom tool to ``{message, rawData, llm,
        tool_call_id}``."""
        result, err = self.result, self.result.error
        if self.kind == "run_code":
            return result.as_dict()
        if err is not None:
            if self.kind == "custom":
                details = {**err, "tool_call_id": result.tool_call_id}
                return {"error": err["code"], "details": details}
            shown = err["details"] if err["details"] is not None else {"message": err["message"]}
            return {"error": err["code"], "details": shown}
        if self.kind == "builtin":
            return result.raw_data
        return {
            "message": result.message,
            "rawData": result.raw_data,
            "llm": result.llm,
            "tool_call_id": result.tool_call_id,
        }
