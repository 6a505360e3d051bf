"""Whether a run may start once its sandbox process is ready: one object per run, which the
runner's link asks (``RunLink.admit``) and tells when the run is over (``RunLink.ended``).

A run of a stored tool starts only if the tool is active then, not merely when the request
arrived (``Admissions.of``); code that is no stored tool's (a draft, ``run_code``, a
program) is always admitted (``OPEN``)."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from toolkiln.services.ports import UnitOfWorkFactory

# A run whose sandbox process was ready within this long of the statement that read its
# tool starts with the status that statement saw; later (it queued), it reads it again.
ADMIT_FRESH_S = 0.001


class Admission:
    """A run's admission: ``admit`` once a process is ready (False: the run is refused,
    ``not_admitted``), ``ended`` once an admitted run is over, before its process goes to
    another call. This one admits every run."""

    def admit(self) -> bool:
        return True

    def ended(self) -> None:
        return None


OPEN = Admission()


class Admissions:
    """The admissions of this process's runs of stored tools, and the runs that ended here
    and whose records are still being written."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow
        self._unrecorded = _Unrecorded()

    def of(self, tool_id: str, read_at: float, deadline: float) -> ToolAdmission:
        """The admission of one run of ``tool_id``, whose status was read by a statement
        sent at ``read_at`` (``time.monotonic()``); the run must be over by ``deadline``.
        Used as a context manager around the run and its record."""
        return ToolAdmission(self, self._unrecorded, tool_id, read_at, deadline)

    def active(self, tool_id: str, read_at: float, deadline: float) -> bool:
        """The status when the run starts, not when the request arrived: the status read
        with the tool stands when a sandbox process was ready within ``ADMIT_FRESH_S`` of
        when the statement that read it was sent (``read_at``): the status is then at most
        that old when the run starts, and the call did not queue. A call that waited longer
        (for its workspace's turn, a process, a package, the GIL) reads it again. The window
        does not count the read's pool checkout and BEGIN
        (docs/decisions/108-one-read-per-call.md).

        A run of the same tool that ended here and whose record (the counters: maybe the
        disable) is still being written is waited for first: the process this call got may
        be the one that run gave back, and the call is queued behind that run
        (tests/reliability/test_disable_race.py)."""
        waited = self._unrecorded.wait(tool_id, deadline)
        if not waited and time.monotonic() - read_at <= ADMIT_FRESH_S:
            return True
        with self._uow(readonly=True, one_statement=True) as tx:
            return tx.tools.status(tool_id) == "active"


class ToolAdmission(Admission):
    """One run of a stored tool: admitted if the tool is active when its process is ready;
    once it ended, later runs of the tool wait for its record, until the ``with`` block
    around the run and its record is left."""

    def __init__(
        self,
        admissions: Admissions,
        unrecorded: _Unrecorded,
        tool_id: str,
        read_at: float,
        deadline: float,
    ) -> None:
        self._admissions = admissions
        self._unrecorded = unrecorded
        self._tool_id = tool_id
        self._read_at = read_at
        self._deadline = deadline
        self._ended = False

    def admit(self) -> bool:
        return self._admissions.active(self._tool_id, self._read_at, self._deadline)

    def ended(self) -> None:
        if not self._ended:
            self._ended = True
            self._unrecorded.add(self._tool_id)

    def __enter__(self) -> ToolAdmission:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ended:
            self._unrecorded.done(self._tool_id)


class _Unrecorded:
    """Runs of each tool that ended in this process and whose record is not written yet."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count: dict[str, int] = {}

    def add(self, tool_id: str) -> None:
        with self._cond:
            self._count[tool_id] = self._count.get(tool_id, 0) + 1

    def done(self, tool_id: str) -> None:
        with self._cond:
            left = self._count.get(tool_id, 0) - 1
            if left > 0:
                self._count[tool_id] = left
            else:
                self._count.pop(tool_id, None)
                self._cond.notify_all()

    def wait(self, tool_id: str, deadline: float) -> bool:
        """Until no run of the tool awaits its record (at most until ``deadline``, a
        ``time.monotonic()``); whether there was one to wait for."""
        with self._cond:
            if not self._count.get(tool_id):
                return False
            while self._count.get(tool_id) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return True
