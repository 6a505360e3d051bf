"""AI-assisted creation: ask a model for a tool, prove it, hand back a draft.

The loop: ask with ``propose_tool`` required; read the first call's arguments; validate the
definition exactly as a create would; run every example in the sandbox and compare it with
its ``expected``; send every problem back as the answer to that call and ask again, up to
the configured number of proposals. Nothing is saved but one audit row.

A generation holds one place of its workspace's long work from the first question to the
draft (``services/places.py``). Its example runs share one budget, and that budget is dry:
a built-in with effects or a custom tool reached from an example answers ``dry_run``,
so a proposal cannot send, store or call anything, however many examples it
gives and however often it is asked again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.builtin import BuiltinSpec
from toolkiln.domain.errors import (
    Conflict,
    GenerationFailed,
    InvalidRequest,
    InvalidTool,
    LlmNotConfigured,
    NotFound,
    ServiceUnavailable,
    ToolkilnError,
)
from toolkiln.domain.generation import (
    FUNCTION_NAME,
    MAX_DESCRIPTION_CHARS,
    ChatReply,
    Proposal,
    ToolCall,
    case_of_example,
    example_problems,
    parse_proposal,
    problems_message,
    propose_tool_function,
    system_prompt,
    tool_choice,
    user_prompt,
)
from toolkiln.domain.limits import MAX_BODY_BYTES, MIN_TIMEOUT_MS
from toolkiln.domain.origin import Budget
from toolkiln.domain.problems import Problem, problem, scrub_all, text_problems
from toolkiln.domain.records import AuditRow
from toolkiln.domain.results import Result
from toolkiln.domain.schema.parameters import schema_to_parameters
from toolkiln.domain.testcases import check_test_cases
from toolkiln.domain.tools import Definition, ToolDraft, check_name
from toolkiln.services.places import Place, Places
from toolkiln.services.ports import ChatModel, UnitOfWorkFactory
from toolkiln.services.testcases import CASES_BUDGET_S
from toolkiln.services.tools import ToolService

Events = Callable[[str, dict[str, Any]], None]


def _ignore(_kind: str, _data: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    workspace_id: str
    description: str
    language: str = "python"
    name: str | None = None


@dataclass(slots=True)
class Usage:
    """What one generation cost."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sandbox_runs: int = 0

    def add(self, reply: ChatReply) -> None:
        self.requests += 1
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "sandbox_runs": self.sandbox_runs,
        }


def _examples_budget() -> Budget:
    """What all the example runs of one generation share, over every attempt: this much
    time, one count of ctx calls, and dryness."""
    return Budget(time.monotonic() + CASES_BUDGET_S, dry=True)


@dataclass(slots=True)
class _Run:
    """One generation under way: who asks, what it cost, where progress goes."""

    principal: Principal
    request: GenerateRequest
    on_event: Events
    usage: Usage
    attempts: int = 0
    name: str | None = None
    budget: Budget = field(default_factory=_examples_budget)


class GenerateService:
    def __init__(
        self,
        uow: UnitOfWorkFactory,
        tools: ToolService,
        model: ChatModel | None,
        runtimes: Callable[[], dict[str, Any]],
        builtins: Callable[[], list[BuiltinSpec]],
        max_attempts: int = 3,
        places: Places | None = None,
    ) -> None:
        self._uow = uow
        self._tools = tools
        self._model = model
        self._runtimes = runtimes
        self._builtins = builtins
        self._max_attempts = max_attempts
        self._places = places or Places()

    def check(self, principal: Principal, request: GenerateRequest) -> None:
        """Everything that can be refused before the model is asked (and a stream starts)."""
        principal.require("write")
        principal.require_workspace(request.workspace_id)
        problems = _request_problems(request)
        if problems:
            raise InvalidRequest("The generation request breaks the rules.", problems)
        with self._uow(readonly=True) as tx:
            if tx.workspaces.get(request.workspace_id) is None:
                raise NotFound("No workspace with that id.")
            if request.name and tx.tools.name_taken(request.workspace_id, request.name):
                raise Conflict(
                    f"A tool named {request.name!r} exists in this workspace.",
                    [{"field": "name", "message": "is taken in this workspace"}],
                    code="name_taken",
                )
        if self._model is None:
            raise LlmNotConfigured(
                "No model endpoint is configured (TOOLKILN_LLM_BASE_URL, TOOLKILN_LLM_MODEL)."
            )
        runtime = self._runtimes().get(request.language) or {}
        if not runtime.get("available"):
            raise ServiceUnavailable(f"The {request.language} runtime is not available.")

    def place(self, request: GenerateRequest) -> Place:
        """A place for the generation (``TooManyRequests`` when its workspace has none
        free). Never waits: a transport takes it on its event loop, then hands it to the
        thread that runs ``generate``, with no await between (a cancellation there would
        keep the place for good)."""
        return self._places.take(request.workspace_id, "generation")

    def admit(self, principal: Principal, request: GenerateRequest) -> Place:
        """``check``, then ``place``: everything refused before the model is asked."""
        self.check(principal, request)
        return self.place(request)

    def generate(
        self,
        principal: Principal,
        request: GenerateRequest,
        on_event: Events = _ignore,
        place: Place | None = None,
    ) -> dict[str, Any]:
        """A draft that passed validation and ran every example, or GenerationFailed.
        ``place``: one taken after ``check`` (``admit``), released here at the end; without
        it, ``admit`` is called here."""
        with place if place is not None else self.admit(principal, request):
            run = _Run(principal, request, on_event, Usage())
            outcome = "interrupted"
            try:
                draft = self._loop(run)
                outcome = "draft"
                return draft
            except ToolkilnError as exc:
                outcome = exc.code
                raise
            finally:
                self._audit(run, outcome)

    # -- the loop

    def _loop(self, run: _Run) -> dict[str, Any]:
        assert self._model is not None  # check() refused otherwise
        language = run.request.language
        with self._uow(readonly=True) as tx:
            allowed = set(tx.workspaces.policy(run.request.workspace_id).builtins)
        builtins = [b for b in self._builtins() if b.name in allowed]
        runtime = self._runtimes()[language]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(language, runtime, builtins)},
            {
                "role": "user",
                "content": user_prompt(run.request.description, language, run.request.name),
            },
        ]
        function = propose_tool_function(language)
        problems: list[Problem] = []
        for attempt in range(1, self._max_attempts + 1):
            run.attempts = attempt
            run.on_event("attempt", {"attempt": attempt, "max_attempts": self._max_attempts})
            reply = self._model.complete(messages, [function], tool_choice())
            run.usage.add(reply)
            messages.append(reply.message)
            call = next((c for c in reply.tool_calls if c.name == FUNCTION_NAME), None)
            if call is None:
                problems = [problem("reply", f"did not call {FUNCTION_NAME}; call it")]
            else:
                draft, problems = self._judge(run, call)
                if draft is not None:
                    return draft
            # The problems may quote the proposal's own text: sent back, and shown, storable.
            problems = scrub_all(problems)
            answer = problems_message(problems, attempt, self._max_attempts)
            # Every tool call must be answered before the conversation may go on.
            for other in reply.tool_calls:
                content = answer if other is call else f"Only the first {FUNCTION_NAME} is read."
                messages.append({"role": "tool", "tool_call_id": other.id, "content": content})
            if call is None:
                messages.append({"role": "user", "content": answer})
            run.on_event("problems", {"attempt": attempt, "problems": problems})
        raise GenerationFailed(
            f"No proposal passed in {self._max_attempts} attempts; details has the last problems.",
            problems,
        )

    def _judge(self, run: _Run, call: ToolCall) -> tuple[dict[str, Any] | None, list[Problem]]:
        request = run.request
        proposal, problems = parse_proposal(call.arguments, request.language, request.name)
        if proposal is None:
            return None, problems
        run.name = proposal.draft.name
        try:
            definition = self._tools.preflight(run.principal, request.workspace_id, proposal.draft)
        except InvalidTool as exc:
            return None, list(exc.details)
        except Conflict:
            taken = f"{proposal.draft.name!r} is taken in this workspace; choose another name"
            return None, [problem("name", taken)]
        run.on_event("validated", {"attempt": run.attempts, "name": proposal.draft.name})
        results: list[Result] = []
        dried: list[bool] = []
        for i, example in enumerate(proposal.examples):
            left_ms = run.budget.left_ms()
            if left_ms < MIN_TIMEOUT_MS:
                spent = f"not run: this generation's {CASES_BUDGET_S:g} s of sandbox time is spent"
                problems.append(problem(f"examples.{i}", spent))
                break
            timed = proposal.draft.timed(min(proposal.draft.definition.timeout_ms, left_ms))
            held_back = run.budget.held_back
            result = self._tools.cases.run_one(
                run.principal, request.workspace_id, timed, example["input"], run.budget
            )
            # What a dry run gave is not what the tool gives: not its test case's expectation.
            dried.append(run.budget.held_back > held_back)
            run.usage.sandbox_runs += 1
            found = example_problems(i, example, result)
            run.on_event(
                "example",
                {
                    "attempt": run.attempts,
                    "index": i,
                    "input": example["input"],
                    "result": result.as_dict(),
                    "passed": not found,
                    "problems": found,
                },
            )
            problems += found
            results.append(result)
        if problems:
            return None, problems
        draft = _draft(proposal, definition, results, dried, run)
        problems = _saving_problems(draft, request.workspace_id)
        if problems:
            return None, problems
        return draft, []

    def _audit(self, run: _Run, outcome: str) -> None:
        request = run.request
        data = {
            "token_id": run.principal.token_id,
            "description": request.description[:500],
            "language": request.language,
            "requested_name": request.name,
            "name": run.name,
            "outcome": outcome,
            "attempts": run.attempts,
            "model": self._model.model if self._model else None,
            "usage": run.usage.as_dict(),
        }
        with self._uow() as tx:  # the name is the model's: text PostgreSQL can store
            tx.audit.add(AuditRow(request.workspace_id, "tool.generated", data=scrub_all(data)))


def _draft(
    proposal: Proposal,
    definition: Definition,
    results: list[Result],
    dried: list[bool],
    run: _Run,
) -> dict[str, Any]:
    d = proposal.draft
    schema = definition.input_schema
    return {
        "name": d.name,
        "description": definition.description,
        "language": definition.language,
        "parameters": schema_to_parameters(schema),
        "input_schema": schema,
        "code": definition.code,
        "execution_message_description": d.execution_message_description,
        "egress": list(definition.egress),
        "examples": [
            {**_shown(example), "result": result.as_dict()}
            for example, result in zip(proposal.examples, results, strict=True)
        ],
        "test_cases": [
            case_of_example(i, example, result, dry)
            for i, (example, result, dry) in enumerate(
                zip(proposal.examples, results, dried, strict=True)
            )
        ],
        "attempts": run.attempts,
        "usage": run.usage.as_dict(),
    }


def _saving_problems(draft: dict[str, Any], workspace_id: str) -> list[Problem]:
    """Why the draft could not be saved as it is handed over: its test cases (the examples
    with what they gave) must pass a create's checks, and the create body must fit."""
    found = check_test_cases(draft["test_cases"])[1]
    for p in found:  # test_cases.<i> is examples.<i> to the model
        p["field"] = "examples" + p.get("field", "").removeprefix("test_cases")
    if found:
        return found
    body = {"workspace_id": workspace_id, **tool_draft_of(draft).as_fields()}
    size = len(json.dumps(body, ensure_ascii=False).encode())
    if size > MAX_BODY_BYTES:
        why = (
            f"the tool with these examples as its test cases would be a create body of {size} "
            f"bytes, over the {MAX_BODY_BYTES} a create accepts: give examples whose results "
            "are smaller"
        )
        return [problem("examples", why)]
    return []


def _shown(example: dict[str, Any]) -> dict[str, Any]:
    """An example as the model gave it (its ``expected`` as read is in the test case)."""
    return {k: v for k, v in example.items() if k != "expect"}


def _request_problems(request: GenerateRequest) -> list[Problem]:
    out: list[Problem] = []
    if not request.description.strip():
        out.append(problem("description", "must describe the tool"))
    elif len(request.description) > MAX_DESCRIPTION_CHARS:
        out.append(problem("description", f"at most {MAX_DESCRIPTION_CHARS} characters"))
    out += text_problems("description", request.description)
    if request.language not in ("python", "javascript"):
        out.append(problem("language", "must be 'python' or 'javascript'"))
    if request.name is not None:
        out += check_name(request.name)
    return out


def tool_draft_of(draft: dict[str, Any]) -> ToolDraft:
    """A generated draft as the definition to create, its examples as its test cases."""
    return ToolDraft.of(
        name=draft["name"],
        language=draft["language"],
        code=draft["code"],
        description=draft["description"],
        input_schema=draft["input_schema"],
        execution_message_description=draft["execution_message_description"],
        test_cases=list(draft["test_cases"]),
        egress=list(draft.get("egress", [])),
    )
