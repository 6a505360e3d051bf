"""The API's ``CodeAnalyser`` (services/ports.py): every analysis of tool code is made by a
runner's code checkers (sandbox/checks.py), never in the API's process.

- Admission: at most ``QUEUED`` analyses of one workspace running or waiting in this
  process (``CheckQueue``, domain/analysis.py); beyond, refused at once (429), so one
  workspace's flood holds no more than that many request threads here, whichever runners
  serve it. Each runner's checkers share their places between workspaces again, across
  every API process that sends them texts, and refuse a workspace's fifth there too.
- Placement: as a root run (``Fleet.analyse``); no runner within ``RUNNER_WAIT_S``, or one
  that does not answer in ``ANSWER_S``, is 503 ``unavailable``.
- Answers: what a runner sends is read under ``runners/wire.py``'s rules and checked as a
  checker's answer is (``Analysis.from_wire``); out of them, the text is refused as the
  checkers failed on it, and the event logged. A runner can still lie about a text within
  those rules (it parses it): that makes the text's own save or run fail, nothing more.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import grpc

from toolkiln.domain.analysis import FAILED, Analysis, CheckQueue, precheck
from toolkiln.domain.errors import ServiceUnavailable, ToolkilnError, TooManyRequests
from toolkiln.runners import wire
from toolkiln.runners.fleet import Fleet
from toolkiln.services import tracing

log = logging.getLogger("toolkiln.runners")

RETRY_AFTER_S = 4  # a checker's 3 s for one analysis, and a second
# How long an analysis waits for a runner that takes work (one restarting comes back).
RUNNER_WAIT_S = 5.0
# One runner's time to answer: a place among its checkers (10 s at most), a checker's start
# (10 s), the analysis (3 s), and the way there and back.
ANSWER_S = 30.0
LIMITS = ("time", "memory", "failed")


class RemoteAnalyser:
    """Analyses on the fleet's runners (see above)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self.queue = CheckQueue(RETRY_AFTER_S)  # per workspace: running or waiting

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        if problems := precheck(language, code):
            return Analysis(tuple(problems))
        with tracing.code_check(language, workspace_id) as span:
            try:
                found = self._admitted(language, code, workspace_id)
            except ToolkilnError as exc:
                tracing.code_checked(span, exc.code)
                raise
            outcome = found.limit or ("problems" if found.problems else "ok")
            tracing.code_checked(span, outcome, len(found.problems))
            return found

    def _admitted(self, language: str, code: str, workspace_id: str) -> Analysis:
        with self.queue.place(workspace_id):
            return self._ask(language, code, workspace_id)

    def _ask(self, language: str, code: str, workspace_id: str) -> Analysis:
        ask = wire.Analyse(language, code, workspace_id)
        try:
            answer = self._fleet.analyse(ask, RUNNER_WAIT_S, ANSWER_S)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServiceUnavailable(
                    "No runner answered a code check in time; try again shortly."
                ) from None
            return _failed(f"the runner failed ({exc.code()})")
        except wire.WireError as exc:
            return _failed(f"an answer outside the protocol ({exc})")
        if answer is None:
            raise ServiceUnavailable(
                "No runner can check code now (none is reachable and serving); try again shortly."
            )
        return _read(answer, language, code)


def _read(answer: wire.Analysed, language: str, code: str) -> Analysis:
    """The analysis in a runner's answer, checked; a refusal as the checkers' own."""
    if answer.refused == "queued":
        raise TooManyRequests(
            "This workspace has its share of code checks under way; try again shortly.",
            retry_after_s=RETRY_AFTER_S,
        )
    if answer.refused == "busy":
        raise ServiceUnavailable("Every code checker is busy; try again shortly.")
    if answer.refused:
        return _failed("an unknown refusal")
    try:
        found = Analysis.from_wire(answer.analysis(), language, code)
    except ValueError as exc:
        return _failed(f"an analysis out of the rules ({exc})")
    if not answer.limit:
        return found
    # An analysis that did not finish: one problem on the code saying why, nothing else.
    if answer.limit not in LIMITS or len(found.problems) != 1:
        return _failed("a limit out of the rules")
    return replace(found, limit=answer.limit)  # type: ignore[arg-type]


def _failed(why: str) -> Analysis:
    log.error("a runner answered a code check out of the rules: %s", why)
    return Analysis.refused(FAILED, "failed")
