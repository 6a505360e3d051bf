"""The host never waits on a sandboxed process past the call's deadline: not while reading
its frames, and not while writing to it. A tool that asks for ctx replies and never reads
them (its receive buffer full) must end as its own ``timeout``, with the service free."""

from __future__ import annotations

import threading
import time

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

ECHO = "def handle(input, ctx):\n    return {'message': 'ok', 'rawData': input.get('s')}\n"
# Three ctx calls sent as raw frames on the tool's own channel, each answered with ~700 KB,
# none of the answers ever read: the host's write of the first one fills the socket.
UNREAD_REPLIES = (
    "import time, protocol\n"
    "def handle(input, ctx):\n"
    "    link, big = ctx._link, 'y' * 700_000\n"
    "    for i in (1, 2, 3):\n"
    "        frame = {'op': 'call', 'run': link.run, 'id': i, 'tool': 'echo',\n"
    "                 'input': {'s': big}}\n"
    "        protocol.send(link.sock, frame)\n"
    "    time.sleep(600)\n"
    "    return 'never'\n"
)


@pytest.fixture(scope="module")
def t(target: Target) -> Tenant:
    return tenant(target.runtime, target.client, "host-waits")


def test_a_tool_that_never_reads_its_ctx_replies_ends_at_its_deadline(
    target: Target, t: Tenant
) -> None:
    t.tool("echo", ECHO, language="python")
    tool = t.tool("unread-replies", UNREAD_REPLIES, language="python", timeout_ms=2000)
    answer: dict = {}
    started = time.monotonic()
    caller = threading.Thread(target=lambda: answer.update(t.invoke(tool)), daemon=True)
    caller.start()
    caller.join(15)
    assert not caller.is_alive(), "the call outlived its 2 s deadline by more than 13 s"
    assert time.monotonic() - started < 6
    assert answer["status"] == "error" and answer["error"]["code"] == "timeout", answer
    assert t.get_tool(tool)["failure_count"] == 1  # the tool's own doing: counted
    target.assert_contained()
