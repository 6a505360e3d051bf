"""The API<->runner messages (runners/wire.py): what a runner sends is read under the rules."""

from __future__ import annotations

import pytest

from toolkiln.runners import wire


def test_every_message_goes_and_comes_back_the_same() -> None:
    messages = [
        wire.Start("python", "code", "main", {"a": [1, 2.5]}, 5000, {"x": None}, "w", "c", "s", 7),
        wire.Start("javascript", "c", "main", {}, 1, {}, "w", "c", "s", None, False, ["zod"], "s"),
        wire.Admit(False),
        wire.Reply(3, {"error": "unknown_tool"}),
        wire.AuditAck(None),
        wire.Ack(),
        wire.Started(True),
        wire.Call(1, "calculate", {"expression": "1+1"}),
        wire.Call(2, "x", {}, "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
        wire.AuditRow("step", [1, "two"]),
        wire.Ended(),
        wire.Done("return", {"message": "hi"}, stdout="out", ctx_calls=2, details={"k": 1}),
        wire.Analyse("javascript", "export function main() {}", "w"),
        wire.Analysed(entrypoint="main", imports=["lodash"], script="function main() {}"),
        wire.Analysed(limit="time", problems=[{"field": "code", "message": "too slow"}]),
        wire.Analysed(refused="queued"),
    ]
    for message in messages:
        assert wire.decode(wire.encode(message), type(message)) == message


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"op": "done", "kind": "return", "value": NaN}',
        b'{"op": "done", "kind": "escaped"}',  # no such outcome
        b'{"op": "done", "kind": "return", "ctx_calls": true}',  # a bool is no count
        b'{"op": "done", "kind": "return", "stdout": 5}',
        b'{"op": "done", "kind": "return", "extra": 1}',
        b'{"op": "call", "id": 1, "tool": 7, "input": {}}',
        b'{"op": "call", "tool": "x", "input": {}}',  # no id
        b'{"op": "call", "id": 1, "tool": "x", "input": {}, "traceparent": 5}',
        b'{"op": "call", "id": 1, "tool": "x", "input": {}, "traceparent": "' + b"0" * 257 + b'"}',
        b'{"op": "start", "language": "python"}',  # not what a runner sends
        b'{"op": "call", "id": 1, "tool": "x", "input": {}, "imports": [1]}',
    ],
)
def test_what_breaks_the_rules_is_refused(raw: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(raw, wire.Started, wire.Call, wire.AuditRow, wire.Ended, wire.Done)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"op": "analysed", "imports": [1]}',  # a module name is text
        b'{"op": "analysed", "problems": {}}',
        b'{"op": "analysed", "limit": 3}',
        b'{"op": "analysed", "owned": true}',
        b'{"op": "analysed", "script": "\\ud800"}',  # a lone surrogate: never repaired here
        b'{"op": "done", "kind": "return"}',  # not an analysis
    ],
)
def test_an_analysis_out_of_the_rules_is_refused(raw: bytes) -> None:
    assert wire.decode(b'{"op": "analysed"}', wire.Analysed) == wire.Analysed()
    with pytest.raises(wire.WireError):
        wire.decode(raw, wire.Analysed)


def test_a_result_spelling_a_lone_surrogate_is_unserializable() -> None:
    raw = b'{"op": "done", "kind": "return", "value": {"m": "\\ud800"}, "stdout": "\\udfff"}'
    done = wire.decode(raw, wire.Done)
    assert done.kind == "unserializable" and done.value is None
    assert done.stdout == "\ufffd"


def test_an_untraced_message_is_as_a_runner_without_traces_knows_it() -> None:
    start = wire.Start("python", "code", "main", {}, 1, {}, "w", "c", "s")
    assert b"traceparent" not in wire.encode(start)
    assert b"traceparent" not in wire.encode(wire.Call(1, "x", {}))
    traced = wire.Call(1, "x", {}, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert b"traceparent" in wire.encode(traced)
