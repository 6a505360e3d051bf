"""Test cases of a tool version and who may call it.

A test case is ``{name, input, expect}``; ``expect`` is a partial Result: each key it gives
must equal the run's (``raw_data`` compared as JSON, so ``1`` equals ``1.0`` but not ``true``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from toolkiln.domain.problems import Problem, json_depth, problem, text_problems
from toolkiln.domain.results import Result

MAX_TEST_CASES = 50
MAX_CASE_NAME_CHARS = 200
EXPECT_KEYS = ("status", "message", "raw_data", "error_code")
CALLERS = ("direct", "code")
DEFAULT_CALLERS = ["direct", "code"]


class CaseSpec(TypedDict):
    name: str
    input: dict[str, Any]
    expect: dict[str, Any]


class CaseReport(TypedDict):
    name: str
    passed: bool
    result: dict[str, Any]
    mismatch: list[dict[str, Any]] | None


def check_test_cases(raw: Any, field: str = "test_cases") -> tuple[list[CaseSpec], list[Problem]]:
    """The cases in their stored form, and every problem with them."""
    if not isinstance(raw, list):
        return [], [problem(field, "must be a list of {name, input, expect}")]
    if len(raw) > MAX_TEST_CASES:
        return [], [problem(field, f"at most {MAX_TEST_CASES} test cases")]
    cases: list[CaseSpec] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{field}.{i}"
        if not isinstance(item, dict):
            problems.append(problem(where, "must be an object {name, input, expect}"))
            continue
        extra = sorted(set(item) - {"name", "input", "expect"})
        if extra:
            problems.append(problem(where, f"unknown keys: {extra}"))
        name, payload, expect = item.get("name"), item.get("input", {}), item.get("expect", {})
        if not isinstance(name, str) or not 0 < len(name.strip()) <= MAX_CASE_NAME_CHARS:
            problems.append(problem(f"{where}.name", f"1 to {MAX_CASE_NAME_CHARS} characters"))
        elif name in seen:
            problems.append(problem(f"{where}.name", "is used by another test case"))
        else:
            seen.add(name)
        if not isinstance(payload, dict):
            problems.append(problem(f"{where}.input", "must be an object (the tool's input)"))
        problems += check_expect(f"{where}.expect", expect)
        problems += text_problems(where, item)[:1]
        if json_depth(item) > 40:
            problems.append(problem(where, "is nested too deeply"))
        if isinstance(name, str) and isinstance(payload, dict) and isinstance(expect, dict):
            cases.append({"name": name, "input": payload, "expect": dict(expect)})
    return cases, problems


def check_expect(where: str, expect: Any) -> list[Problem]:
    if not isinstance(expect, dict):
        return [problem(where, f"must be a partial Result with keys from {list(EXPECT_KEYS)}")]
    out: list[Problem] = []
    unknown = sorted(set(expect) - set(EXPECT_KEYS))
    if unknown:
        out.append(problem(where, f"unknown keys {unknown}; allowed: {list(EXPECT_KEYS)}"))
    if "status" in expect and expect["status"] not in ("ok", "error"):
        out.append(problem(f"{where}.status", "must be 'ok' or 'error'"))
    if "message" in expect and not isinstance(expect["message"], str | None):
        out.append(problem(f"{where}.message", "must be a string or null"))
    if "error_code" in expect and not isinstance(expect["error_code"], str | None):
        out.append(problem(f"{where}.error_code", "must be a string or null"))
    return out


def check_callers(raw: Any, field: str = "allowed_callers") -> list[Problem]:
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        return [problem(field, f"must be a list drawn from {list(CALLERS)}")]
    unknown = sorted(set(raw) - set(CALLERS))
    if unknown:
        return [problem(field, f"unknown callers {unknown}; allowed: {list(CALLERS)}")]
    if len(set(raw)) != len(raw):
        return [problem(field, "lists a caller twice")]
    if not raw:
        return [problem(field, "must name at least one of 'direct' and 'code'")]
    return []


def mismatch(expect: dict[str, Any], result: Result) -> list[dict[str, Any]]:
    """What of ``expect`` the result does not match; empty when it passes."""
    actual = {
        "status": result.status,
        "message": result.message,
        "raw_data": result.raw_data,
        "error_code": result.error["code"] if result.error else None,
    }
    return [
        {"field": key, "expected": expect[key], "actual": actual[key]}
        for key in EXPECT_KEYS
        if key in expect and not json_equal(expect[key], actual[key])
    ]


def report(case: CaseSpec, result: Result) -> CaseReport:
    wrong = mismatch(case["expect"], result)
    return {
        "name": case["name"],
        "passed": not wrong,
        "result": result.as_dict(),
        "mismatch": wrong or None,
    }


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: numbers by value, but a boolean is never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
