"""``make install`` repairs what a clean removed: the sandbox's C module is built in place,
its stamp lives in the venv, and a clean that keeps the venv (``git clean -fdx -e .venv``)
must not leave the install believing it is done."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JAIL = ROOT / "src" / "toolkiln" / "sandbox" / "jail"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def variable(name: str, *args: str) -> str:
    return make("-s", "--eval", f"print-var: ; @echo $({name})", "print-var", *args).strip()


def dry_install(venv: Path, spawn: Path) -> str:
    """What ``make install`` would run, with ``venv`` and the built module at ``spawn``."""
    return make("-n", "install", f"VENV={venv}", f"SPAWN={spawn}")


def test_the_install_knows_where_it_builds_the_c_module() -> None:
    built = ROOT / variable("SPAWN")
    assert built.parent == JAIL and built.name.startswith("_spawn.")
    assert built in JAIL.glob("_spawn*.so")


def test_the_install_is_redone_when_the_c_module_is_missing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = Path(variable("STAMP", f"VENV={venv}"))
    assert stamp.parent == venv
    stamp.touch()  # newer than pyproject.toml and _spawn.c: installed, by the stamp
    module = tmp_path / "_spawn.so"
    module.touch()
    assert "pip install" not in dry_install(venv, module)
    module.unlink()  # what `git clean -fdx -e .venv` does to it
    assert "pip install" in dry_install(venv, module)
