"""Class: a call cannot see anything of another call's scratch, not even its metadata.

Each uid's scratch is a tmpfs of its own, and a call's directory in it is new. The names
are not secret (uids are consecutive, directory numbers count up), so what hides one
call's scratch from another is permission. Until 2026-12-06 the tmpfs was mounted at
``/tmp/<uid>``, reachable by every uid: a tool could ``statvfs`` another uid's tmpfs (bytes
and files in use) and ``stat`` its scratch directory (size, time of the last write) while
another workspace's call was writing there.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.security.conftest import Target

WRITER = (
    "import os, time\n"
    "def handle(i, c):\n"
    "    for n in range(37):\n"
    "        with open(f'f{n}', 'wb') as f:\n"
    "            f.write(b'x' * 100_000)\n"
    "    time.sleep(1.5)\n"
    "    return [os.getuid(), os.getcwd()]"
)

SPY = (
    "import os, time\n"
    "def handle(i, c):\n"
    "    time.sleep(0.5)\n"
    "    me = os.getuid()\n"
    "    mine = os.getcwd()\n"
    "    shared = os.statvfs('/tmp').f_fsid  # /tmp itself: every call's, constant\n"
    "    seen = []\n"
    "    for uid in range(me - 200, me + 200):\n"
    "        if uid == me:\n"
    "            continue\n"
    "        for path in (f'/tmp/{uid}', f'/tmp/{uid}/s'):\n"
    "            try:\n"
    "                v = os.statvfs(path)\n"
    "                if v.f_fsid != shared:  # another uid's own tmpfs\n"
    "                    seen.append([path, v.f_blocks - v.f_bfree, v.f_files - v.f_ffree])\n"
    "            except OSError:\n"
    "                pass\n"
    "        for base in (f'/tmp/{uid}', f'/tmp/{uid}/s'):\n"
    "            try:\n"
    "                os.stat(base)  # else no path below it resolves either\n"
    "            except OSError:\n"
    "                continue\n"
    "            for n in range(0, 3000, 1):\n"
    "                try:\n"
    "                    st = os.stat(f'{base}/{n}')\n"
    "                    seen.append([base, n, st.st_size, st.st_mtime])\n"
    "                    break\n"
    "                except OSError:\n"
    "                    continue\n"
    "    return {'mine': mine, 'seen': seen}"
)


def test_a_call_sees_nothing_of_another_calls_scratch(target: Target) -> None:
    results: dict[str, Any] = {}
    writer = threading.Thread(
        target=lambda: results.setdefault("w", target.run(WRITER, timeout_ms=10_000))
    )
    writer.start()
    try:
        results["spy"] = target.run(SPY, timeout_ms=10_000)
    finally:
        writer.join(20)
    assert results["w"]["status"] == "ok", results["w"]["error"]
    spy = results["spy"]
    assert spy["status"] == "ok", spy["error"]
    assert spy["raw_data"]["seen"] == [], spy["raw_data"]
    # Its own scratch is where the docs say, and the writer's was one too.
    assert "/s/" in spy["raw_data"]["mine"] and "/s/" in results["w"]["raw_data"][1]
    target.assert_contained()
