"""Class: a run's channel works whatever its descriptor's number.

The service takes each warm child's channel as the lowest free descriptor. Once it holds
1024 or more (idle client connections are enough, and no token is needed to open them),
new channels get numbers of 1024 and more, and ``select()`` refuses those: every call
handed such a child ended as ``infra_error`` (until 2026-12-06). The host's waits on a
channel (reading a frame by its deadline, writing one, the JavaScript worker's check that
its control socket is quiet) are exercised here on descriptors far above 1024.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator

import pytest

from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.javascript_runtime import _quiet
from toolkiln.sandbox.pool import WarmChild


def _high() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft > 1100, "the test needs a descriptor limit above 1100"
    return min(soft - 10, 4000)


@pytest.fixture
def channel() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A socket pair whose host end has a descriptor number above 1024."""
    host, peer = socket.socketpair()
    number = _high()
    os.dup2(host.fileno(), number)
    high = socket.socket(fileno=number)
    host.close()
    assert high.fileno() >= 1024
    try:
        yield high, peer
    finally:
        high.close()
        peer.close()


def test_a_frame_is_read_by_its_deadline_on_a_high_descriptor(
    channel: tuple[socket.socket, socket.socket],
) -> None:
    high, peer = channel
    reader = protocol.Reader(high)
    with pytest.raises(protocol.FrameError) as waited:
        reader.recv(1 << 20, time.monotonic() + 0.05)
    assert waited.value.kind == "timeout"
    protocol.send(peer, {"op": "result", "value": 1})
    assert reader.recv(1 << 20, time.monotonic() + 5) == {"op": "result", "value": 1}
    assert not protocol.readable(high, 0)
    peer.close()
    assert protocol.readable(high, 5)  # its close is something to read too


def test_a_frame_is_written_by_its_deadline_on_a_high_descriptor(
    channel: tuple[socket.socket, socket.socket],
) -> None:
    high, peer = channel
    protocol.write(high, protocol.encode({"op": "run"}), time.monotonic() + 5)
    assert protocol.Reader(peer).recv(1 << 20, time.monotonic() + 5) == {"op": "run"}


def test_a_quiet_worker_is_told_from_a_talking_one_on_a_high_descriptor(
    channel: tuple[socket.socket, socket.socket],
) -> None:
    high, peer = channel
    worker = WarmChild(sock=high, pid=1, global_pid=1, cgroup=None, pidfd=-1)
    assert _quiet(worker)
    peer.send(b"x")
    assert not _quiet(worker)
