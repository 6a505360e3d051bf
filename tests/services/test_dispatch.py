"""The built-ins: one list of names (domain/records.py BUILTIN_NAMES), which the wired tools
match, each under its own spec's name."""

from __future__ import annotations

from typing import Any

import pytest

from toolkiln.app import Runtime
from toolkiln.builtins.calculate import Calculate
from toolkiln.domain.builtin import BuiltinCall, BuiltinSpec
from toolkiln.domain.records import BUILTIN_NAMES
from toolkiln.services.dispatch import Builtins


class Renamed:
    """A built-in whose spec gives another name."""

    def __init__(self, name: str) -> None:
        self.spec = BuiltinSpec(name, "", {"type": "object"})

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        return {}


def test_the_service_offers_every_built_in_a_policy_can_name(runtime: Runtime) -> None:
    offered = [spec.name for spec in runtime.services.router.specs()]
    assert sorted(offered) == sorted(BUILTIN_NAMES)


def test_a_built_in_is_known_by_its_spec_name() -> None:
    builtins = Builtins([Calculate()])
    assert [s.name for s in builtins.specs()] == ["calculate"]
    assert builtins.knows("calculate") and not builtins.knows("send_email")


@pytest.mark.parametrize("tools", [[Renamed("calc")], [Calculate(), Renamed("calculate")]])
def test_a_built_in_the_policy_cannot_name_or_named_twice_is_refused(tools: list[Any]) -> None:
    with pytest.raises(ValueError, match="unknown to the policy or given twice"):
        Builtins(tools)
