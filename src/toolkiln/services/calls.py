"""What a request says about its call before the router takes it: the ids the client gave,
whether a model or the API calls (the source), and the checks those ids pass. Every
transport (REST, MCP) and every use case that starts a call (invoke, an agent's dispatch)
builds its call's ``Caller`` here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict, InvalidRequest
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MAX_CALL_ID_CHARS
from toolkiln.domain.origin import Caller, Source
from toolkiln.domain.problems import Problem, problem
from toolkiln.domain.text import is_client_id

CLIENT_IDS = ("tool_call_id", "agent_id", "conversation_id", "power_user_id")


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
