"""AI-assisted creation: the ``propose_tool`` function, the prompt, and
how a proposal is read, judged and turned into a draft. Pure rules; the loop is in
``services/generate.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolkiln.domain.builtin import BuiltinSpec
from toolkiln.domain.problems import Problem, problem
from toolkiln.domain.results import Result
from toolkiln.domain.testcases import EXPECT_KEYS, check_expect, mismatch
from toolkiln.domain.tools import ToolDraft

FUNCTION_NAME = "propose_tool"
MAX_EXAMPLES = 10
MAX_DESCRIPTION_CHARS = 4000
# What of a value the problems quote back to the model: enough to see, not a flood.
QUOTE_CHARS = 400


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ChatReply:
    """One answer of a chat-completions endpoint, as much of it as the loop needs."""

    message: dict[str, Any]  # the assistant message, to send back in the conversation
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class Proposal:
    """A proposal whose arguments parsed: a definition and its examples."""

    draft: ToolDraft
    parameters: dict[str, Any] | None
    examples: list[dict[str, Any]]


def propose_tool_function(language: str) -> dict[str, Any]:
    """The one tool offered to the model, in chat-completions form."""
    return {
        "type": "function",
        "function": {
            "name": FUNCTION_NAME,
            "description": "Propose the complete custom tool: definition, code and examples.",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "description": "lowercase kebab-case, at most 64 characters",
                    },
                    "description": {
                        "type": "string",
                        "description": "what the tool does, for the agents that will call it",
                    },
                    "language": {"type": "string", "enum": [language]},
                    "parameters": {
                        "type": "object",
                        "description": (
                            'the inputs: {"start_value": {"type": "number", "required": true, '
                            '"description": "..."}}; types are JSON Schema types'
                        ),
                    },
                    "code": {"type": "string", "description": "the whole source of the tool"},
                    "execution_message_description": {
                        "type": "string",
                        "description": "a short status line shown while the tool runs",
                    },
                    "egress": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": (
                            "hosts the code's http_request may reach, e.g. api.example.com, "
                            "*.example.org, api.example.com:8443; leave out if it reaches none"
                        ),
                    },
                    "examples": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_EXAMPLES,
                        "items": {
                            "type": "object",
                            "properties": {
                                "input": {"type": "object"},
                                "expected": {
                                    "type": "object",
                                    "description": (
                                        "what the run must give: any of status, message, "
                                        "raw_data, error_code"
                                    ),
                                },
                            },
                            "required": ["input"],
                        },
                    },
                },
                "required": ["name", "description", "language", "parameters", "code", "examples"],
            },
        },
    }


def tool_choice() -> dict[str, Any]:
    return {"type": "function", "function": {"name": FUNCTION_NAME}}


SHAPES = {
    "python": (
        "def main(**params):\n"
        '    n = params["n"]\n'
        '    return {"message": f"{n} doubled is {n * 2}", "rawData": {"doubled": n * 2}}'
    ),
    "javascript": (
        "function main(params) {\n"
        "  const n = params.n;\n"
        "  return { message: `${n} doubled is ${n * 2}`, rawData: { doubled: n * 2 } };\n"
        "}"
    ),
}


def system_prompt(language: str, runtime: dict[str, Any], builtins: list[BuiltinSpec]) -> str:
    """The language's real contract (from the runtimes description) and the allowed built-ins."""
    entrypoints = "\n".join(f"- {e['name']}: {e['signature']}" for e in runtime["entrypoints"])
    packages = ", ".join(f"{d['name']} {d['version']}" for d in runtime["dependencies"]) or "none"
    stdlib = "the standard library" if language == "python" else "the ECMAScript built-ins"
    tools = "\n".join(
        f"- {b.name}: {b.description} Input schema: {json.dumps(b.input_schema)}" for b in builtins
    )
    acting = ", ".join([b.name for b in builtins if b.effects] + ["any custom tool"])
    return f"""You write custom tools for Toolkiln, a sandboxed runtime for AI-agent tools.
Answer only by calling the function {FUNCTION_NAME} with the complete tool.

The tool is written in {language}. Its code defines exactly one entrypoint:
{entrypoints}
Return contract: {runtime["return_contract"]}
ctx (the second argument of handle, or of main where allowed) offers: {", ".join(runtime["ctx"])}.
The code may import {stdlib} and only these packages: {packages}.
The sandbox has no network, no files and no subprocesses: the only way out is the built-in
http_request, to the hosts listed in egress (a key is written {{{{secrets.NAME}}}} in a header,
never in code).
The shape of a tool (not your task):
{SHAPES.get(language, "")}
Built-in tools the code may call through ctx.tools.<name>(input):
{tools or "- none in this workspace"}

Rules:
- name: lowercase kebab-case (a-z, 0-9, single hyphens), at most 64 characters.
- parameters: every input the code reads, each {{"type": ..., "required": ..., "description"}}.
- examples: 1 to {MAX_EXAMPLES} inputs that show what the tool does, each with "expected":
  the parts of the result that must come out, from status ("ok"), message, raw_data (the
  returned rawData) and error_code. Every example is run in the sandbox and must succeed.
- Examples run dry: a ctx.tools call to {acting} answers {{"error": "dry_run", ...}}
  instead of acting. An example that makes one expects what holds either way (status "ok").
- If you are told of problems, fix all of them and call {FUNCTION_NAME} again with the whole
  tool, not a patch."""


def user_prompt(description: str, language: str, name: str | None) -> str:
    wanted = f' Name it "{name}".' if name else ""
    return f"Write a {language} tool that does this:\n{description}\n{wanted}".rstrip()


def parse_proposal(
    arguments: str, language: str, name: str | None
) -> tuple[Proposal | None, list[Problem]]:
    """Read a call's arguments; every problem with their shape at once."""
    try:
        raw = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        where = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        msg = getattr(exc, "msg", str(exc))
        return None, [problem("arguments", f"are not valid JSON: {msg}", *where)]
    if not isinstance(raw, dict):
        return None, [problem("arguments", "must be a JSON object with the tool's fields")]
    problems: list[Problem] = []

    def text(key: str, required: bool = True) -> str | None:
        value = raw.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            problems.append(problem(key, "is required and must be a string"))
            return None
        return value

    proposed_name, code = text("name"), text("code")
    description = text("description", required=False) or ""
    status_line = text("execution_message_description", required=False)
    if raw.get("language", language) != language:
        problems.append(problem("language", f"must be {language!r}, as asked"))
    parameters = raw.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        problems.append(problem("parameters", "must be an object of parameter specs"))
        parameters = None
    egress = raw.get("egress", [])
    if not isinstance(egress, list):
        problems.append(problem("egress", "must be a list of hosts"))
        egress = []
    examples = _examples(raw.get("examples"), problems)
    if problems:
        return None, problems
    draft = ToolDraft.of(
        name=name or proposed_name or "",
        language=language,
        code=code or "",
        description=description,
        parameters=parameters if parameters is not None else {},
        execution_message_description=status_line,
        egress=list(egress),
    )
    return Proposal(draft, parameters, examples), []


def _examples(raw: Any, problems: list[Problem]) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_EXAMPLES:
        problems.append(problem("examples", f"give 1 to {MAX_EXAMPLES} examples"))
        return []
    out = []
    for i, item in enumerate(raw):
        where = f"examples.{i}"
        if not isinstance(item, dict) or not isinstance(item.get("input", {}), dict):
            problems.append(problem(where, 'must be {"input": {...}, "expected": {...}}'))
            continue
        example: dict[str, Any] = {"input": item.get("input", {})}
        if item.get("expected") not in (None, {}):
            example["expected"] = item["expected"]
            example["expect"] = as_expect(item["expected"])
        out.append(example)
    return out


def as_expect(expected: Any) -> dict[str, Any]:
    """An example's ``expected`` as a partial Result. Models write it either way: as a
    partial Result (``{"raw_data": ...}``), or as the value the tool returns (the seed's
    ``{"cagr": 0.1487, ...}``, or a message string). Only a valid partial Result is read as
    one; any other object or value is the expected ``raw_data``, a string the ``message``."""
    if isinstance(expected, dict) and expected and set(expected) <= set(EXPECT_KEYS):
        if not check_expect("expected", expected):
            return dict(expected)
    if isinstance(expected, str):
        return {"message": expected}
    return {"raw_data": expected}


def example_problems(index: int, example: dict[str, Any], result: Result) -> list[Problem]:
    """Why an example's run does not count as a success; empty when it does."""
    where = f"examples.{index}"
    if result.status != "ok":
        err = result.error or {}
        details = err.get("details")
        line = details.get("line") if isinstance(details, dict) else None
        text = f"the run failed with {err.get('code')}: {err.get('message')}"
        if err.get("code") == "invalid_input":
            text += f" ({_quote(details)})"
        stderr = result.logs.get("stderr", "")
        if stderr:
            text += f"; stderr: {_quote(stderr)}"
        return [problem(where, text, line if isinstance(line, int) else None)]
    return [
        problem(
            f"{where}.expected.{m['field']}",
            f"expected {_quote(m['expected'])}, the run gave {_quote(m['actual'])}",
        )
        for m in mismatch(example.get("expect") or {}, result)
    ]


def problems_message(problems: list[Problem], attempt: int, max_attempts: int) -> str:
    """The answer to a proposal that was not accepted: the tool message's content."""
    return json.dumps(
        {
            "accepted": False,
            "attempt": attempt,
            "attempts_left": max_attempts - attempt,
            "problems": problems,
            "summary": "\n".join(_said(p) for p in problems),
            "instruction": (
                f"Fix every problem (lines are 1-based, in the code) and call {FUNCTION_NAME} "
                "again with the whole tool."
            ),
        },
        ensure_ascii=False,
    )


def _said(p: Problem) -> str:
    """One problem as a line of text: where, then what."""
    where = p.get("field", "")
    if "line" in p:
        where += f" (line {p['line']}" + (f", column {p['column']})" if "column" in p else ")")
    return f"- {where}: {p.get('message', '')}"


def case_of_example(
    index: int, example: dict[str, Any], result: Result, dry: bool = False
) -> dict[str, Any]:
    """An example as a test case: its expected, or else what it gave, must come out again.
    ``dry``: a call of its run answered ``dry_run``, so what it gave is not
    what the tool gives when it acts; only its expected (or its status) is kept."""
    expect: dict[str, Any] = {"status": "ok"}
    if example.get("expect"):
        expect.update(example["expect"])
    elif dry:
        pass
    elif result.raw_data is not None:
        expect["raw_data"] = result.raw_data
    else:
        expect["message"] = result.message
    return {"name": f"example {index + 1}", "input": example["input"], "expect": expect}


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."
