"""What the service says of its languages when nothing offers one."""

from __future__ import annotations

from toolkiln.services.system import SystemService


def test_a_language_nothing_offers_is_described_as_unavailable() -> None:
    offered = {"python": {"available": True, "ready": True}}
    found = SystemService(lambda: None, lambda: dict(offered)).runtimes()
    assert found["python"] == {"available": True, "ready": True}
    js = found["javascript"]
    assert js["available"] is False and js["ready"] is False
    assert js["entrypoints"] == [] and js["ctx"] == [] and js["dependencies"] == []
    assert js["return_contract"] == "" and js["limits"] == {} and js["isolation"] == {}
    # Each answer's description is its own value: changing one leaves the next intact.
    js["ctx"].append("changed")
    again = SystemService(lambda: None, lambda: {}).runtimes()
    assert again["javascript"]["ctx"] == [] and again["python"]["available"] is False
