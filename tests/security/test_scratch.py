"""What a call leaves in its scratch directory reaches no other call, and cannot hold up or end
the process that makes every workspace's sandboxes (the template).

Each uid has a tmpfs of its own (capped in bytes and in files; a uid serves one call at a
time) and each child a new directory in it, removed after its reap by a walk that cannot
raise or recurse. These attacks were found by an
outside review: a tree 1000 levels deep ended the template (RecursionError in its clean-up,
so every call in flight failed with infra_error), and ~200,000 empty files held it for
seconds while it removed them one by one (other workspaces' calls waited, some past their
deadline).
"""

from __future__ import annotations

import threading

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant
from toolkiln.sandbox.runner import Limits

DEEP = (
    "import os\n"
    "def handle(i, c):\n"
    "    for _ in range(i['depth']):\n"
    "        os.mkdir('d'); os.chdir('d')\n"
    "    return i['depth']\n"
)
FLOOD = (
    "import os\n"
    "def handle(i, c):\n"
    "    n = 0\n"
    "    try:\n"
    "        while n < i['most']:\n"
    "            os.close(os.open(f'f{n}', os.O_CREAT | os.O_WRONLY, 0o600)); n += 1\n"
    "    except OSError as exc:\n"
    "        return {'made': n, 'error': exc.errno}\n"
    "    return {'made': n, 'error': None}\n"
)
FILL = (
    "import os, time\n"
    "def handle(i, c):\n"
    "    written, n = 0, 0\n"
    "    chunk = b'x' * (1 << 20)\n"
    "    try:\n"
    "        while written < i['mb'] << 20:\n"
    "            with open(f'big{n}', 'wb') as f:\n"
    "                for _ in range(8):\n"
    "                    f.write(chunk); written += len(chunk)\n"
    "            n += 1\n"
    "    except OSError as exc:\n"
    "        err = exc.errno\n"
    "    else:\n"
    "        err = None\n"
    "    time.sleep(i.get('hold', 0))\n"
    "    return {'mb': written >> 20, 'error': err}\n"
)
SLEEP = "import os, time\ndef handle(i, c):\n    time.sleep(i['s'])\n    return os.listdir('.')\n"


@pytest.fixture(scope="module")
def tenants(target: Target) -> tuple[Tenant, Tenant]:
    return tenant(target.runtime, target.client, "scratch-a"), tenant(
        target.runtime, target.client, "scratch-b"
    )


def _restarts(target: Target) -> int:
    return int(target.runtime.sandboxes["python"].describe()["pool"]["template_restarts"])


def _beside(victim: Tenant, tool: str, payload: dict, attack) -> tuple[dict, object]:
    """The victim's call runs while ``attack()`` does; both results."""
    got: dict[str, dict] = {}
    t = threading.Thread(target=lambda: got.setdefault("v", victim.invoke(tool, payload)))
    t.start()
    result = attack()
    t.join()
    return got["v"], result


def test_a_deep_tree_left_behind_ends_nothing(
    target: Target, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    deep = a.tool("deep", DEEP, language="python", timeout_ms=10000)
    slow = b.tool("slow", SLEEP, language="python", timeout_ms=10000)
    before = _restarts(target)
    victim, result = _beside(b, slow, {"s": 2.0}, lambda: a.invoke(deep, {"depth": 1500}))
    assert isinstance(result, dict) and result["status"] == "ok", result["error"]
    assert result["raw_data"] == 1500
    assert victim["status"] == "ok", victim["error"]
    assert victim["raw_data"] == []
    assert _restarts(target) == before  # the template lived through the clean-up
    again = a.invoke(deep, {"depth": 3})  # and the next child starts with an empty scratch
    assert again["status"] == "ok" and again["raw_data"] == 3
    target.assert_contained()


def test_a_file_flood_stops_at_the_calls_own_cap(
    target: Target, tenants: tuple[Tenant, Tenant]
) -> None:
    a, b = tenants
    flood = a.tool("flood", FLOOD, language="python", timeout_ms=20000)
    slow = b.tool("slow-flood", SLEEP, language="python", timeout_ms=10000)
    before = _restarts(target)
    cap = Limits().scratch_files
    victim, result = _beside(b, slow, {"s": 1.0}, lambda: a.invoke(flood, {"most": 100_000}))
    assert isinstance(result, dict) and result["status"] == "ok", result["error"]
    made = result["raw_data"]
    assert made["error"] == 28  # ENOSPC: the tmpfs has no inode left
    assert cap - 16 <= made["made"] < cap  # its own directory is one of them
    assert victim["status"] == "ok", victim["error"]
    # The next calls, of either workspace, start empty and may make their own files.
    assert b.invoke(slow, {"s": 0})["raw_data"] == []
    again = a.invoke(flood, {"most": 10})
    assert again["raw_data"] == {"made": 10, "error": None}
    assert _restarts(target) == before
    target.assert_contained()


def test_a_full_scratch_leaves_another_calls_scratch_its_room(
    target: Target, tenants: tuple[Tenant, Tenant]
) -> None:
    """The bytes cap is each call's own: a call that fills its scratch makes no other call's
    writes fail (until this change /tmp was one tmpfs shared by the calls of the moment)."""
    a, b = tenants
    fill = a.tool("fill", FILL, language="python", timeout_ms=10000)
    mine = b.tool("fill-some", FILL, language="python", timeout_ms=10000)
    scratch_mb = Limits().scratch_mb
    got: dict[str, dict] = {}
    t = threading.Thread(
        target=lambda: got.setdefault("a", a.invoke(fill, {"mb": scratch_mb * 2, "hold": 1.5}))
    )
    t.start()
    # While a's scratch is full (a holds it for 1.5 s), b writes a quarter of its own cap.
    import time

    time.sleep(0.7)
    victim = b.invoke(mine, {"mb": scratch_mb // 4})
    t.join()
    filled = got["a"]
    assert filled["status"] == "ok", filled["error"]
    assert filled["raw_data"]["error"] == 28 and filled["raw_data"]["mb"] <= scratch_mb
    assert victim["status"] == "ok", victim["error"]
    assert victim["raw_data"] == {"mb": scratch_mb // 4, "error": None}
    target.assert_contained()
