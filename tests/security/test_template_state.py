"""What a Python template holds before its first fork is in every child: since
docs/decisions/103-template-rehearses-the-call-path.md it
rehearses a child's path there (pyrunner.rehearse: socket pairs, links, readers, captured
output, for code that says ``async`` an event loop each time). The attack: a tool looking in
its own process for what the template left (a link or reader of another run, with its
buffered frames; a socket or loop to write through) to read or reach anything but its own
call. Everything of that kind a tool can find must be its call's own."""

from __future__ import annotations

import pytest

from tests.security.conftest import Target

# The module's name in two parts: code that says "async" runs in the asyncio template.
PROBE = (
    "import gc, socket, sys\n"
    "def handle(i, c):\n"
    "    gc.unfreeze()  # the template's objects too (frozen before its first fork)\n"
    "    gc.collect()\n"
    "    objs = gc.get_objects()\n"
    "    runner, protocol = sys.modules['pyrunner'], sys.modules['protocol']\n"
    "    aio = sys.modules.get('asyn' + 'cio')\n"
    "    loops = [o for o in objs if aio is not None and isinstance(o, aio.AbstractEventLoop)]\n"
    "    return {\n"
    "        'links': [link.run for link in objs if type(link) is runner._Link],\n"
    "        'readers': sum(type(o) is protocol.Reader for o in objs),\n"
    "        'captures': sum(type(o) is runner.CappedText for o in objs),\n"
    "        'sockets': sum(isinstance(o, socket.socket) for o in objs),\n"
    "        'loops': [loop.is_closed() for loop in loops],\n"
    "        'runners': sum(aio is not None and type(o) is aio.Runner for o in objs),\n"
    "    }\n"
)


@pytest.mark.parametrize("says_async", [False, True], ids=["lean", "async"])
def test_a_tool_finds_nothing_of_the_templates_rehearsal(target: Target, says_async: bool) -> None:
    code = PROBE + ("# async\n" if says_async else "")
    seen = [target.run(code, name="rehearsal-probe") for _ in range(2)]
    for out in seen:
        assert out["status"] == "ok", (out["error"], out["logs"])
        found = out["raw_data"]
        # One link, the call's own (a run id the host made, never the rehearsal's), its
        # reader, the call's stdout and stderr; its channel, and where asyncio is preloaded
        # the loop made for this call (open) with its self-pipe and its runner: no more.
        assert len(found["links"]) == 1 and found["links"][0] != "rehearsal", found
        assert found["readers"] == 1 and found["captures"] == 2, found
        assert found["sockets"] == (3 if says_async else 1), found
        assert found["loops"] == ([False] if says_async else []), found
        assert found["runners"] == (1 if says_async else 0), found
    assert seen[0]["raw_data"]["links"] != seen[1]["raw_data"]["links"]  # a run id per call
    target.assert_contained()
