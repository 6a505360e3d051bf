"""A REST invoke reads the database once before its sandbox run: the token, the tool and its
workspace's policy in one statement, which is then a unit of its own (on PostgreSQL in
autocommit, no BEGIN or COMMIT around it: tests/storage/test_prepared.py). A call id given
by the client is checked in the same unit, which is then a transaction of two statements.
Counted with SQLAlchemy's event hooks on SQLite and PostgreSQL
(docs/decisions/108-one-read-per-call.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PG_URL
from tests.mcp.test_call_reads import recording
from tests.reliability.harness import fresh_postgres_database
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.domain.auth import Bearer
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.calls import CallContext

TOKEN = "tk_invoke-reads-admin"


@dataclass
class Served:
    runtime: Runtime
    tool_id: str


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    with contextlib.ExitStack() as stack:
        url = (
            None
            if request.param == "sqlite"
            else stack.enter_context(fresh_postgres_database(PG_URL))
        )
        rt = build(Settings(data_dir=tmp_path, database_url=url), hosted=True)
        stack.callback(rt.close)
        rt.services.access.bootstrap(TOKEN)
        who = rt.services.access.authenticate(TOKEN)
        ws = rt.services.access.create_workspace(None, f"reads-{request.param}")
        draft = ToolDraft.of(
            name="greet", language="python", code="def main(**p):\n    return {'message': 'ok'}"
        )
        tool = rt.services.tools.create(who, ws.id, draft)
        yield Served(rt, tool.id)


@pytest.mark.parametrize("call_id", [None, "call-1"], ids=["no call id", "a call id"])
def test_an_invoke_reads_once_before_its_run(
    served: Served, monkeypatch: pytest.MonkeyPatch, call_id: str | None
) -> None:
    recorder = recording(served.runtime, monkeypatch)
    who = CallContext.of(tool_call_id=call_id)
    result = served.runtime.services.invoke.invoke(Bearer(TOKEN), served.tool_id, {}, who)
    assert result.status == "ok", result
    units = recorder.before_run()
    described = [(u.readonly, u.one_statement, u.statements) for u in units]
    # The status re-read of an admission that waited longer than its window is a unit of
    # one statement of its own, at most one (services/admission.py).
    reads = [u for u in units if not u.statements[0].startswith("SELECT tools.status")]
    assert len(reads) == 1 and reads[0].readonly, described
    (read,) = reads
    assert "FROM tokens" in read.statements[0] and "tools" in read.statements[0], described
    if call_id is None:
        assert read.one_statement and len(read.statements) == 1, described
    else:
        assert not read.one_statement and len(read.statements) == 2, described
        assert "FROM tool_calls" in read.statements[1], described
