"""Turning what the host observed into the contract's ``Result``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolkiln.domain.execution import RunOutcome
from toolkiln.domain.shaping import shaping_problems

COUNTED = {
    "runtime_error",
    "timeout",
    "memory_limit",
    "output_too_large",
    "invalid_result",
    "sandbox_violation",
}
NOT_EXECUTED = {"invalid_input", "tool_disabled", "infra_error"}


@dataclass(slots=True)
class Result:
    tool_call_id: str
    tool_id: str | None
    version: int | None
    status: str
    message: str | None = None
    raw_data: Any = None
    llm: Any = None
    render: Any = None
    interactive: Any = None
    error: dict[str, Any] | None = None
    duration_ms: float = 0.0
    ctx_calls: int = 0
    logs: dict[str, str] = field(default_factory=lambda: {"stdout": "", "stderr": ""})

    def as_dict(self) -> dict[str, Any]:
        """Every field, in field order. The values are JSON the Result does not change once
        made, so they are shared, not deep-copied as ``dataclasses.asdict`` did (a tool's whole
        ``raw_data``, copied for each of the dicts a call makes); ``error`` and ``logs`` are
        copied one level, so a caller may add to them."""
        return {
            "tool_call_id": self.tool_call_id,
            "tool_id": self.tool_id,
            "version": self.version,
            "status": self.status,
            "message": self.message,
            "raw_data": self.raw_data,
            "llm": self.llm,
            "render": self.render,
            "interactive": self.interactive,
            "error": dict(self.error) if self.error is not None else None,
            "duration_ms": self.duration_ms,
            "ctx_calls": self.ctx_calls,
            "logs": dict(self.logs),
        }

    @property
    def counts_as_failure(self) -> bool:
        """A failure of the tool's own doing. The host marks one that is not (the call
        waited out its time for a process, or ran out of its caller's time) with
        ``details.counted: false``."""
        if self.error is None or self.error["code"] not in COUNTED:
            return False
        details = self.error.get("details")
        return not (isinstance(details, dict) and details.get("counted") is False)

    @property
    def reached_execution(self) -> bool:
        return self.error is None or self.error["code"] not in NOT_EXECUTED


def error(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details}


def refused(call_id: str, tool_id: str | None, version: int | None, err: dict[str, Any]) -> Result:
    """A call that never reached the sandbox (invalid input, disabled tool, infra failure)."""
    return Result(call_id, tool_id, version, "error", error=err)


def shape(
    call_id: str, tool_id: str | None, version: int | None, entry: str, run: RunOutcome
) -> Result:
    result = Result(
        call_id,
        tool_id,
        version,
        "error",
        duration_ms=round(run.duration_ms, 3),
        ctx_calls=run.ctx_calls,
        logs={"stdout": run.stdout, "stderr": run.stderr},
    )
    if run.kind != "return":
        result.error = _failure(run)
        return result
    problem = _read_value(result, entry, run.value)
    if problem is not None:
        result.error = error("invalid_result", problem)
        result.message = result.raw_data = result.llm = None
        return result
    result.status = "ok"
    return result


def _read_value(result: Result, entry: str, value: Any) -> str | None:
    """Fill message/raw_data/llm/render/interactive; return a problem, or None if it fits."""
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        problems = shaping_problems(value)
        if problems:
            return f"the result's display fields break their schema: {problems[:5]}"
        result.message = value["message"]
        result.raw_data = value.get("rawData")
        result.llm = value.get("_llm", value["message"])
        result.render = value.get("_render")
        result.interactive = value.get("_interactive")
        return None
    if entry == "main":
        if not isinstance(value, dict):
            return f"main must return a dict with a string 'message', not {_kind(value)}"
        return "main must return a dict with a string 'message' key"
    result.raw_data = value
    result.message = json.dumps(value, ensure_ascii=False)
    result.llm = result.message
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _failure(run: RunOutcome) -> dict[str, Any]:
    if run.kind == "exception":
        details: dict[str, Any] = {"type": run.error_type, "message": run.message, "line": run.line}
        if run.column is not None:
            details["column"] = run.column
        text = f"{run.error_type}: {run.message}" if run.message else str(run.error_type)
        return error("runtime_error", text, details)
    table = {
        "timeout": ("timeout", "The tool ran past its time limit and was stopped."),
        "memory": ("memory_limit", "The tool reached its memory limit and was stopped."),
        "too_large": ("output_too_large", "The tool's result is larger than the cap."),
        "unserializable": ("invalid_result", "The tool's return value is not JSON."),
        "garbled": ("invalid_result", "The tool's process sent a malformed report."),
        "violation": (
            "sandbox_violation",
            "The tool attempted an operation the sandbox forbids and was stopped.",
        ),
        "crash": ("runtime_error", "The tool's process ended without returning a result."),
        "infra": ("infra_error", "The service could not run the tool."),
    }
    code, message = table[run.kind]
    if run.message and run.kind in {"unserializable", "crash", "violation", "too_large"}:
        message = f"{message} {run.message}"
    return error(code, message, run.details or None)


def last_error_text(result: Result) -> str | None:
    if result.error is None:
        return None
    return f"{result.error['code']}: {result.error['message']}"[:2000]
