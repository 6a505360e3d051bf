"""What analysing one text of tool code found: the one value every caller of a code check uses.

Tool code is untrusted text, and parsing it can take far longer than its size suggests
(CPython parses a 256 KiB f-string of 65,000 fields in quadratic time, holding the GIL). So
no service parses it: each asks a ``CodeAnalyser`` (services/ports.py) for this value, which
is made once per text (and workspace) where parsing is bounded in time and memory
(sandbox/checks.py), and checked here on its way back (``Analysis.from_wire``), because what
comes back from a process that parsed hostile text is not trusted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from toolkiln.domain import limits
from toolkiln.domain.errors import TooManyRequests
from toolkiln.domain.problems import Problem, bad_text, problem, text_problems

LANGUAGES = ("python", "javascript")
ENTRYPOINTS = ("main", "handle")
MAX_PROBLEMS = 5  # an analysis reports the first problems it finds
MAX_MESSAGE_CHARS = 500
MAX_IMPORT_CHARS = 256  # a module name as written
# Why an analysis did not finish: over its time or memory, or its checker failed on the text.
Limit = Literal["", "time", "memory", "failed"]
# The problem of a text whose checker failed on it, or answered out of the rules.
FAILED = "could not be parsed: the code checker failed on it"
# Analyses one workspace may have running or waiting in one process (a runner's checkers, the
# API's analyser): beyond, refused at once (429), so that one workspace's flood holds no more
# than this many of the process' threads (tests/runners/test_analyse.py).
QUEUED = 4
_WIRE_KEYS = {"problems", "entrypoint", "imports", "script"}
_OPTIONAL_WIRE_KEYS = {"takes_ctx"}  # a checker of a release before it: True
_PROBLEM_KEYS = {"field", "message", "line", "column"}


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything a caller needs from parsing one text: the problems that make it no valid
    tool code (with line and column), the entrypoint it defines, the modules it imports (what
    the host installs), and for JavaScript the script the engine runs (exports stripped,
    ``import`` rewritten as ``require`` on the same line)."""

    problems: tuple[Problem, ...] = ()
    entrypoint: str = ""  # "main" or "handle" when there is no problem
    imports: tuple[str, ...] = ()
    script: str = ""  # JavaScript only
    # False only when the checker found that the entrypoint is never given ``ctx`` and the
    # code names nothing that could reach it (domain/code_check.py): its runs may go one way
    # to a runner (runners/wire.py RunOneWay; a ctx call there anyway makes the runner give
    # the run up and the API send it again on the stream).
    takes_ctx: bool = True
    limit: Limit = ""  # set when the analysis did not finish: never cached, never stored

    @classmethod
    def refused(cls, message: str, limit: Limit) -> Analysis:
        """An analysis that did not finish, with the one problem that says why."""
        return cls((problem("code", message),), limit=limit)

    def to_wire(self) -> dict[str, Any]:
        return {
            "problems": [dict(p) for p in self.problems],
            "entrypoint": self.entrypoint,
            "imports": list(self.imports),
            "script": self.script,
            "takes_ctx": self.takes_ctx,
        }

    @classmethod
    def from_wire(cls, data: Any, language: str, code: str) -> Analysis:
        """The analysis of ``code`` a checker answered, checked before any of it is used:
        its shape, its text (storable, within caps), and that it is consistent (problems or
        an entrypoint, never both; a script only for JavaScript that can run). Raises
        ValueError for anything else."""
        keys = set(data) if isinstance(data, dict) else set()
        if not _WIRE_KEYS <= keys <= _WIRE_KEYS | _OPTIONAL_WIRE_KEYS:
            raise ValueError("not an analysis")
        takes_ctx = data.get("takes_ctx", True)
        if type(takes_ctx) is not bool or (data["problems"] and not takes_ctx):
            raise ValueError("takes_ctx is a boolean, False only for code that runs")
        problems = tuple(_problem(p, code) for p in _list(data["problems"], MAX_PROBLEMS))
        entry, script = data["entrypoint"], data["script"]
        if entry not in ("", *ENTRYPOINTS) or (entry == "") != bool(problems):
            raise ValueError("an analysis names an entrypoint or problems")
        imports = tuple(_list(data["imports"], len(code)))
        if not all(_text(n, MAX_IMPORT_CHARS) for n in imports) or len(set(imports)) < len(imports):
            raise ValueError("imports are distinct module names")
        if sum(len(n) for n in imports) > len(code):
            raise ValueError("more imported names than the code holds")
        if not isinstance(script, str) or (script and not _text(script, script_cap(code))):
            raise ValueError("the script is not text within its cap")
        runs_script = language == "javascript" and not problems
        if bool(script) != runs_script or (problems and imports):
            raise ValueError("a script is the form of JavaScript that runs, and only that")
        return cls(problems, entry, imports, script, takes_ctx)


def script_cap(code: str) -> int:
    """The longest script ``code`` can become: each ``import`` statement rewritten as one or
    two ``require`` lines is at most about three times as long as it was."""
    return 4 * len(code) + 1024


def precheck(language: str, code: str) -> list[Problem]:
    """What is wrong with the text before anything parses it: the language, the size, and
    text that is not storable (a checker is never sent what this refuses)."""
    if language not in LANGUAGES:
        return [problem("language", "must be 'python' or 'javascript'")]
    if len(code) > limits.MAX_CODE_CHARS:
        return [problem("code", f"must be at most {limits.MAX_CODE_CHARS} characters")]
    if not code.strip():
        return [problem("code", "must not be empty")]
    return text_problems("code", code)


def _list(value: Any, most: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError("a list over its cap")
    return value


def _text(value: Any, most: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= most and bad_text(value) is None


def _problem(value: Any, code: str) -> Problem:
    if not isinstance(value, dict) or not set(value) <= _PROBLEM_KEYS:
        raise ValueError("a problem is {field, message, line?, column?}")
    if value.get("field") != "code" or not _text(value.get("message"), MAX_MESSAGE_CHARS):
        raise ValueError("a problem of the code, with a message")
    bounds = {"line": code.count("\n") + 2, "column": len(code.encode()) + 2}
    for key, most in bounds.items():
        at = value.get(key)
        if at is not None and not (type(at) is int and 0 <= at <= most):
            raise ValueError(f"a {key} inside the code")
    return problem("code", value["message"], value.get("line"), value.get("column"))


class CheckQueue:
    """The analyses of each workspace running or waiting in one process: at most ``QUEUED``;
    the next one is refused at once (``TooManyRequests``, retry after ``retry_after_s``)."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        self._queued: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, workspace_id: str) -> int:
        with self._lock:
            return self._queued.get(workspace_id, 0)

    @contextmanager
    def place(self, workspace_id: str) -> Iterator[None]:
        """One of the workspace's places, held while the block runs."""
        with self._lock:
            queued = self._queued.get(workspace_id, 0)
            if queued >= QUEUED:
                raise TooManyRequests(
                    f"This workspace has {queued} code checks under way; try again shortly.",
                    retry_after_s=self.retry_after_s,
                )
            self._queued[workspace_id] = queued + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._queued.pop(workspace_id) - 1
                if left:
                    self._queued[workspace_id] = left
