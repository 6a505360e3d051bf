"""The host<->jail protocol module: framing, the run tag, caps and the text rules."""

from __future__ import annotations

import socket

import pytest

from toolkiln.sandbox.jail import protocol

CAPS = protocol.Caps()


def roundtrip(data: bytes) -> tuple[object, frozenset[str]]:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        reader = protocol.Reader(b)
        value = reader.recv(CAPS.frame_bytes, deadline=None)
        return value, reader.repaired


def test_lone_surrogates_never_fail_a_write_and_are_repaired_on_read() -> None:
    frame = {"op": "result", "value": {"k\udc80": "v\ud800"}, "stdout": "fine"}
    jail_side = protocol.encode(frame)  # escaped: the host sees and judges them
    value, repaired = roundtrip(jail_side)
    assert value == {"op": "result", "value": {"k\ufffd": "v\ufffd"}, "stdout": "fine"}
    assert repaired == {"value"}
    host_side = protocol.encode(frame, repair=True)  # replaced before it leaves the host
    assert b"\\ud800" not in host_side and roundtrip(host_side)[1] == frozenset()


def test_a_valid_pair_is_not_a_repair() -> None:
    value, repaired = roundtrip(protocol.encode({"v": "\U0001f600"}, repair=False))
    assert value == {"v": "\U0001f600"} and repaired == frozenset()
    escaped = b'{"v":"\\ud83d\\ude00"}'
    value, repaired = roundtrip(protocol.HEADER.pack(len(escaped)) + escaped)
    assert value == {"v": "\U0001f600"} and repaired == frozenset()


@pytest.mark.parametrize(
    "body", [b"\xed\xa0\x80", b'"\xff"', b"{", b"[" * 100_000 + b"]" * 100_000]
)
def test_bodies_that_are_not_utf8_json_are_garbage(body: bytes) -> None:
    with pytest.raises(protocol.FrameError) as err:
        roundtrip(protocol.HEADER.pack(len(body)) + body)
    assert err.value.kind == "garbage"


def test_a_frame_over_the_cap_is_refused_before_its_body_is_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(protocol.HEADER.pack(CAPS.frame_bytes + 1))
        with pytest.raises(protocol.FrameError) as err:
            protocol.Reader(b).recv(CAPS.frame_bytes)
        assert err.value.kind == "too_large"


def test_frames_of_another_run_or_of_unknown_kind_are_refused() -> None:
    ok = protocol.parse({"op": "call", "run": "r1", "id": 1, "tool": "t", "input": {}}, "r1", CAPS)
    assert ok == protocol.Call(1, "t", {})
    for frame in (
        {"op": "call", "run": "r0", "id": 1, "tool": "t"},
        {"op": "call", "id": 1, "tool": "t"},
        {"op": "call", "run": "r1", "id": True, "tool": "t"},
        {"op": "infra", "run": "r1"},
        {"op": "result", "run": "r1", "kind": "infra_error"},
        ["op", "result"],
    ):
        with pytest.raises(protocol.FrameError):
            protocol.parse(frame, "r1", CAPS)


def test_reported_fields_are_typed_and_capped() -> None:
    report = protocol.parse(
        {
            "op": "result",
            "run": "r",
            "kind": "exception",
            "type": "T" * 500,
            "message": 7,
            "line": True,
            "column": 3,
            "stdout": "o" * (CAPS.log_bytes * 2),
            "needed_packages": ["pytz", 3],  # the host takes no package request from a child
        },
        "r",
        CAPS,
    )
    assert isinstance(report, protocol.Report)
    assert len(report.type) == CAPS.type_chars and report.message == ""
    assert report.line is None and report.column == 3
    assert report.stdout.startswith("o" * CAPS.log_bytes + "\n[truncated: ")
    assert len(report.stdout.encode()) <= CAPS.log_bytes + 100 and not hasattr(report, "needed")
    call = protocol.parse({"op": "call", "run": "r", "id": 1, "tool": "n" * 10_000}, "r", CAPS)
    assert isinstance(call, protocol.Call) and len(call.tool) == CAPS.name_chars + 1


def test_a_reply_over_the_jails_cap_becomes_an_envelope() -> None:
    small = protocol.Caps(reply_bytes=1000)
    data = protocol.reply("r", 4, {"big": "x" * 5000}, small)
    value, _ = roundtrip(data)
    assert isinstance(value, dict) and value["id"] == 4 and value["run"] == "r"
    assert value["result"]["error"] == "too_large"
    assert value["result"]["details"]["max_bytes"] == 1000
    assert len(data) - protocol.HEADER.size <= 1000
