"""A template that ends before its hello says why: the last line it wrote to stderr."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.sandbox.links import NoCtx, analysed
from toolkiln.sandbox import pool
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable
from toolkiln.sandbox.sandboxes import python_sandbox

JAIL = pool.TEMPLATE.parent
FLOOD = (
    "import os\n"
    "def handle(i, c):\n"
    "    try:\n"
    "        for _ in range(64):\n"
    "            os.write(2, b'x' * 65536)\n"
    "    except OSError as exc:\n"
    "        return exc.errno\n"
    "    return 'written'\n"
)


def test_a_template_without_its_c_module_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jail's code without the module the install builds (as after ``git clean -fdx``):
    the template's ImportError reaches the host's refusal."""
    jail = tmp_path / "jail"
    shutil.copytree(JAIL, jail, ignore=shutil.ignore_patterns("_spawn*.so", "__pycache__"))
    assert list(JAIL.glob("_spawn*.so")) and not list(jail.glob("_spawn*.so"))
    monkeypatch.setattr(pool, "TEMPLATE", jail / "template.py")
    with pytest.raises(SandboxUnavailable) as refused:
        python_sandbox(PackageStore(tmp_path / "pkgs"), warm=1)
    message = str(refused.value)
    assert "the template exited during set-up" in message
    assert "No module named '_spawn'" in message


def test_what_children_write_to_their_stderr_descriptor_holds_no_one(tmp_path: Path) -> None:
    """Once it said hello, the host no longer reads the template's stderr, and holds no pipe
    there either: a child that writes megabytes to descriptor 2 cannot fill a pipe and hold
    itself or the next writer until a timeout."""
    sb = python_sandbox(PackageStore(tmp_path / "pkgs"), warm=1)
    try:
        for _ in range(2):
            out = sb.run(analysed("python", FLOOD, 5000), NoCtx())
            assert out.kind == "return", (out.kind, out.message)
    finally:
        sb.close()
