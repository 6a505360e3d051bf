"""The test cases of a PATCH run outside any transaction. What is stored must be what they
ran against: if another writer changed something they depend on meanwhile, the PATCH is
refused (409 edit_conflict); if the PATCH overrides that change anyway, it is applied."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Space
from toolkiln.app import Runtime
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict
from toolkiln.domain.origin import Budget
from toolkiln.domain.results import Result
from toolkiln.domain.tools import ToolDraft
from toolkiln.sandbox import patterns
from toolkiln.services.testcases import CaseRunner
from toolkiln.services.tools import ToolService

CODE = "def main(**p):\n    return {'message': 'v%d', 'rawData': %d}\n"


def racing(runtime: Runtime, space: Space, name: str, meanwhile: dict[str, Any]):
    who = runtime.services.access.authenticate(space.tokens["invoke,read,write"])
    registry = runtime.services.tools
    cases = [{"name": "one", "input": {}, "expect": {"status": "ok"}}]
    draft = ToolDraft.of(name=name, language="python", code=CODE % (1, 1), test_cases=cases)
    tool = registry.create(who, space.id, draft)
    done: list[bool] = []

    def run_and_interfere(
        p: Principal,
        ws: str,
        d: ToolDraft,
        payload: Any,
        budget: Budget | None,
        tool_id: str | None,
    ) -> Result:
        if not done:  # another writer lands while our cases run
            registry.update(who, tool.id, meanwhile)
            done.append(True)
        return registry.cases.run_one(p, ws, d, payload, budget, tool_id)

    service = ToolService(
        runtime.database.transaction,
        runtime.services.router.analyser,
        CaseRunner(run_and_interfere),
        positions=runtime.services.audit.positions,
        searcher=patterns.shared(),
    )
    return who, tool, service


def test_a_change_the_cases_did_not_see_refuses_the_patch(runtime: Runtime, space: Space) -> None:
    who, tool, service = racing(runtime, space, "raced", {"timeout_ms": 2000})
    with pytest.raises(Conflict) as refused:
        service.update(who, tool.id, {"code": CODE % (2, 2)})
    assert refused.value.code == "edit_conflict"
    now = runtime.services.tools.get(who, tool.id)
    assert (now.version, now.definition.code, now.definition.timeout_ms) == (2, CODE % (1, 1), 2000)


def test_a_change_the_patch_overrides_is_last_writer_wins(runtime: Runtime, space: Space) -> None:
    who, tool, service = racing(runtime, space, "overridden", {"code": CODE % (3, 3)})
    updated = service.update(who, tool.id, {"code": CODE % (2, 2)})
    assert (updated.version, updated.definition.code) == (3, CODE % (2, 2))
