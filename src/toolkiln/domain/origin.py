"""Where a call comes from, and what it may still spend: one value through every nested call.

A root call (an API invoke, an agent's tool call, an MCP call, ``POST /v1/run-code``, a test
run) makes one ``Origin``. Everything nested under it (``ctx.tools`` calls from its code,
custom tools those reach, code run through ``run_code``, their own ``ctx`` calls) gets a child
of it: the same caller and the same ``Budget`` object, a longer chain, its own call id. So
the 50-call budget, the deadline, the recursion guard, the policy read, the memory share and
whether the call is dry (a generation's example: nothing acts outside it) cover the whole
tree, whichever path a call takes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from toolkiln.domain.auth import Principal
from toolkiln.domain.execution import ResourceShare
from toolkiln.domain.records import AuditRow, Policy

Source = Literal["api", "llm", "code"]
MAX_CTX_CALLS = 50
# The caller fields a tool's ``ctx`` shows (``Origin.for_code``), as each runtime describes them.
CTX_CALLER_FIELDS = ("agentId", "agentName", "powerUserId", "toolCallId", "conversationId")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who called, as the audit and the tool's ``ctx`` show it."""

    principal: Principal
    workspace_id: str
    source: Source = "api"
    agent_id: str | None = None
    agent_name: str | None = None
    conversation_id: str | None = None
    power_user_id: str | None = None


@dataclass(slots=True)
class Budget:
    """Shared by reference by a root call and everything nested under it."""

    deadline: float  # time.monotonic()
    max_calls: int = MAX_CTX_CALLS
    used: int = 0
    policy: Policy | None = None  # read once: with an invoked tool, else at its first use
    share: ResourceShare = field(default_factory=ResourceShare)
    counting: bool = True  # False under a test run: nothing nested is counted or stored
    # True under a generation's example runs: every call in the tree that
    # would act outside it (a built-in with effects, a custom tool) answers ``dry_run``.
    dry: bool = False
    held_back: int = 0  # calls answered ``dry_run`` so far

    def holds_back(self, acts: bool) -> bool:
        """Whether a call that ``acts`` outside the call is answered ``dry_run`` instead
        (counted): the one rule the router and the built-ins' dispatch both ask."""
        if self.dry and acts:
            self.held_back += 1
            return True
        return False

    @classmethod
    def lasting(cls, ms: int) -> Budget:
        return cls(time.monotonic() + ms / 1000)

    def narrow(self, ms: int) -> None:
        """A root call learns its own limit once it knows what it runs."""
        self.deadline = min(self.deadline, time.monotonic() + ms / 1000)

    def left_ms(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)

    def spend(self) -> str | None:
        """Count one ``ctx.tools`` call; the error code that refuses it, or None."""
        self.used += 1
        if self.used > self.max_calls:
            return "call_limit"
        if time.monotonic() >= self.deadline:
            return "timeout"
        return None


@dataclass(frozen=True, slots=True)
class Offer:
    """The tools a caller is offered when that is less than the whole workspace (an agent,
    a code-mode program): built-ins by name, custom tools by id with their pinned version."""

    builtins: frozenset[str]
    custom: dict[str, int | None] = field(default_factory=dict)  # tool id -> pinned version


@dataclass(frozen=True, slots=True)
class Origin:
    """One call's place in its tree: who, the root, its parent, the chain, the budget."""

    caller: Caller
    call_id: str  # this call's id (the root's for a root call)
    budget: Budget
    parent_call_id: str | None = None
    chain: tuple[str, ...] = ()  # ids of the custom tools on the path to this call
    tool_id: str | None = None  # the custom tool whose code runs here, if any
    rows: list[AuditRow] = field(default_factory=list)  # this run's rows, written at its end
    offer: Offer | None = None  # what this run's ctx.tools reach; None: its whole workspace
    # The deadline (time.monotonic()) of the run whose code makes this call, when it is one:
    # a nested tool's own timeout_ms may end it before the root call's deadline.
    run_deadline: float | None = None
    # The egress list of the tool version whose code runs here (a draft's under a test
    # run); None where no tool's code runs (a model's or the API's own call, run_code and
    # code mode as root calls): there the workspace policy's list applies.
    egress: tuple[str, ...] | None = None

    @classmethod
    def root(
        cls,
        caller: Caller,
        call_id: str,
        budget: Budget,
        offer: Offer | None = None,
        egress: tuple[str, ...] | None = None,
    ) -> Origin:
        return cls(caller, call_id, budget, offer=offer, egress=egress)

    @property
    def workspace_id(self) -> str:
        return self.caller.workspace_id

    @property
    def deadline(self) -> float:
        """When this call must be over (``time.monotonic()``): the root call's deadline, or
        the deadline of the run it is made from when that comes first."""
        if self.run_deadline is None:
            return self.budget.deadline
        return min(self.budget.deadline, self.run_deadline)

    def left_ms(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)

    def within(self, timeout_ms: int) -> Origin:
        """This origin as seen by the code of a run that starts now with ``timeout_ms``."""
        return replace(self, run_deadline=min(self.deadline, time.monotonic() + timeout_ms / 1000))

    def nested(self, call_id: str) -> Origin:
        """A call of its own under this one (a custom tool or ``run_code`` reached from this
        call's code): same caller and budget, this call as its parent, rows of its own."""
        return replace(self, call_id=call_id, parent_call_id=self.call_id, rows=[])

    def entering(self, tool_id: str, egress: tuple[str, ...] = ()) -> Origin:
        """This call, now running the code of ``tool_id`` (which joins the chain), whose
        version may reach ``egress``. A tool's own code reaches its workspace's tools,
        whoever offered the tool to the caller."""
        chain = (*self.chain, tool_id)
        return replace(self, chain=chain, tool_id=tool_id, offer=None, egress=egress)

    def from_code(self) -> Origin:
        """A call made by the code running here: source ``code``, this call as parent."""
        return replace(self, caller=replace(self.caller, source="code"))

    def row(self, event: str, data: Any, *, tool_id: str | None = None) -> AuditRow:
        return AuditRow(
            self.workspace_id,
            event,
            source=self.caller.source,
            tool_id=tool_id if tool_id is not None else self.tool_id,
            tool_call_id=self.call_id,
            agent_id=self.caller.agent_id,
            data=data,
        )

    def for_code(self) -> dict[str, Any]:
        """What the tool's ``ctx`` shows of its caller (``CTX_CALLER_FIELDS``)."""
        c = self.caller
        values = (c.agent_id, c.agent_name, c.power_user_id, self.call_id, c.conversation_id)
        return dict(zip(CTX_CALLER_FIELDS, values, strict=True))
