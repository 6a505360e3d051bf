"""Result shaping: the contract of section 5 and the _render/_interactive schemas."""

from __future__ import annotations

from dataclasses import asdict, fields

from toolkiln.domain.execution import RunOutcome
from toolkiln.domain.results import Result, shape


def ok(value: object, entry: str = "main") -> dict:
    return shape("c", "t", 1, entry, RunOutcome("return", value)).as_dict()


def test_main_and_handle_shapes() -> None:
    r = ok({"message": "m", "rawData": {"a": 1}, "_llm": "for the model"})
    assert (r["status"], r["message"], r["raw_data"], r["llm"]) == (
        "ok",
        "m",
        {"a": 1},
        "for the model",
    )
    assert ok([1, 2], "handle")["message"] == "[1, 2]"
    assert ok(None, "handle")["raw_data"] is None
    assert ok({"no": "message"})["error"]["code"] == "invalid_result"
    assert ok("text")["error"]["code"] == "invalid_result"


def test_render_and_interactive_are_validated() -> None:
    good = {
        "message": "m",
        "_render": {"type": "table", "columns": ["a"], "rows": [[1]]},
        "_interactive": {
            "type": "buttons",
            "buttons": [
                {
                    "label": "Approve",
                    "action": {"type": "call_tool", "tool": "approve", "input": {}},
                }
            ],
        },
    }
    r = ok(good)
    assert r["render"]["type"] == "table" and r["interactive"]["buttons"][0]["label"] == "Approve"
    form = {
        "message": "m",
        "_interactive": {
            "type": "form",
            "fields": [{"name": "qty", "label": "Quantity", "type": "number"}],
            "submit": {"label": "Order", "action": {"type": "message", "text": "ordered"}},
        },
    }
    assert ok(form)["status"] == "ok"
    for bad in [
        {"message": "m", "_render": {"type": "html", "html": "<script>"}},
        {"message": "m", "_render": {"type": "image", "url": "javascript:alert(1)"}},
        {"message": "m", "_interactive": {"type": "buttons", "buttons": []}},
        {"message": "m", "_llm": 5},
    ]:
        assert ok(bad)["error"]["code"] == "invalid_result", bad


def test_a_result_as_a_dict_holds_every_field_as_asdict_would() -> None:
    """``Result.as_dict`` is written out (asdict deep-copied a tool's whole raw_data for each
    dict a call makes): it must still hold every field, with the same values."""
    r = Result(
        "call-1",
        "tool-1",
        3,
        "error",
        message="m",
        raw_data={"rows": [1, {"a": None}]},
        llm="for the model",
        render={"kind": "table"},
        interactive={"buttons": []},
        error={"code": "runtime_error", "message": "x", "details": {"line": 2}},
        duration_ms=1.5,
        ctx_calls=2,
        logs={"stdout": "out", "stderr": "err"},
    )
    shown = r.as_dict()
    assert list(shown) == [f.name for f in fields(Result)]
    assert shown == asdict(r)
    shown["error"]["extra"] = 1  # a caller adding to the error or logs changes no Result
    shown["logs"]["stdout"] = "changed"
    assert r.error is not None and "extra" not in r.error and r.logs["stdout"] == "out"
