"""A run's admission (services/admission.py): the status read with its tool stands when a
process was ready at once; a run of the same tool that ended and whose record is still being
written is waited for first, and the status is then read again. On the runtime's database."""

from __future__ import annotations

import threading
import time

from tests.conftest import Space
from toolkiln.app import Runtime
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.admission import OPEN, Admissions


def test_open_admission_admits_every_run() -> None:
    assert OPEN.admit() is True
    OPEN.ended()  # nothing to tell


def test_a_run_waits_for_the_record_of_a_run_of_its_tool_that_ended(
    runtime: Runtime, space: Space
) -> None:
    """The first run ended and its record (here: the disable it brings) is not written yet:
    the second run's admission waits for it, then reads the status again and refuses.
    Without the wait it would start on the status its own read saw (active)."""
    who = runtime.services.access.authenticate(space.tokens["invoke,read,write"])
    draft = ToolDraft.of(name="admitted", language="python", code="def main(**p):\n    return 1\n")
    tool = runtime.services.tools.create(who, space.id, draft)
    admissions = Admissions(runtime.database.transaction)
    deadline = time.monotonic() + 30
    answers: list[bool] = []

    def second() -> None:
        answers.append(admissions.of(tool.id, time.monotonic(), deadline).admit())

    with admissions.of(tool.id, time.monotonic(), deadline) as first:
        assert first.admit()  # read just now: the status it saw stands
        first.ended()
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.2)
        assert waiting.is_alive() and answers == []  # held behind the first run's record
        runtime.services.tools.disable(who, tool.id, "the first run's record")
    waiting.join(30)
    assert answers == [False]


def test_a_run_that_never_ended_holds_nobody_back(runtime: Runtime, space: Space) -> None:
    """A run refused at admission (it never ended) leaves no record to wait for."""
    who = runtime.services.access.authenticate(space.tokens["invoke,read,write"])
    draft = ToolDraft.of(
        name="refused-run", language="python", code="def main(**p):\n    return 1\n"
    )
    tool = runtime.services.tools.create(who, space.id, draft)
    admissions = Admissions(runtime.database.transaction)
    deadline = time.monotonic() + 30
    with admissions.of(tool.id, time.monotonic(), deadline):
        pass
    assert admissions.of(tool.id, time.monotonic(), deadline).admit()
