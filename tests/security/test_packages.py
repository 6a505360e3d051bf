"""Packages: the host alone decides what to install, from the code, off the call path.

Real pip and npm installs into stores of these tests' own (docs/security.md, "Packages")."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SHAPE
from tests.sandbox.links import analysed
from toolkiln.domain.code_check import analyse
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox, python_sandbox


class Link:
    def __init__(self) -> None:
        self.audits: list[str] = []

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {"error": "unknown_tool"}

    def audit(self, event: str, data: object) -> None:
        self.audits.append(event)


def run(sb: Sandbox, code: str, timeout_ms: int = 30000, link: Link | None = None):
    return sb.run(analysed(sb.language, code, timeout_ms), link or Link())


def python_imports(code: str) -> tuple[str, ...]:
    return analyse("python", code).imports


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=2, name="pkgs-py")
    yield sb
    sb.close()


# --- what the host reads from the code


def test_the_host_finds_imports_anywhere_in_the_code() -> None:
    code = (
        "import json\n"
        "def main(**p):\n"
        "    import pytz\n"
        "    if p.get('x'):\n"
        "        from dateutil import parser\n"
        "    try:\n"
        "        import yaml.constructor as yc\n"
        "    except ImportError:\n"
        "        pass\n"
        "    def inner():\n"
        "        from markupsafe import escape\n"
        "    importlib.import_module('regex')\n"
        "    __import__('six')\n"
        "    import_module('numpy.linalg')\n"
        "    from . import sibling\n"
        "    importlib.import_module(p['name'])\n"  # computed: cannot be known
        "    return 1\n"
    )
    found = python_imports(code)
    assert found == ("json", "pytz", "dateutil", "yaml", "markupsafe", "regex", "six", "numpy")
    assert python_imports("def broken(:\n    import pytz") == ()


# --- a listed package imports on its first call, wherever the import stands

FIRST_CALLS = {
    "inside-main": ("pytz", "def handle(i, c):\n    import pytz\n    return pytz.utc.zone"),
    "conditional": (
        "six",
        "def handle(i, c):\n    if i.get('never', True):\n        import six\n    return six.PY3",
    ),
    "import-module-literal": (
        "yaml",
        "import importlib\n"
        "def handle(i, c):\n"
        "    return importlib.import_module('yaml').safe_dump({'a': 1})",
    ),
}
EXPECTED = {"inside-main": "UTC", "conditional": True, "import-module-literal": "a: 1\n"}


@pytest.mark.parametrize("case", sorted(FIRST_CALLS))
def test_a_listed_package_imports_on_its_first_call(python: Sandbox, case: str) -> None:
    package, code = FIRST_CALLS[case]
    root = python.packages.root
    assert not (root / package).exists() and not (root / f"{package}.py").exists()
    out = run(python, code)
    assert out.kind == "return" and out.value == EXPECTED[case], (out.kind, out.message)
    assert (root / package).exists() or (root / f"{package}.py").exists()


def test_prepare_installs_ahead_of_the_first_call(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "pkgs")
    code = "def handle(i, c):\n    from markupsafe import escape\n    return str(escape('<'))"
    sb = python_sandbox(store, warm=1, name="pkgs-prep")
    try:
        sb.prepare(python_imports(code))  # what the service calls when code is saved
        deadline = time.monotonic() + 120
        while not store.installed("MarkupSafe==3.0.3"):
            assert time.monotonic() < deadline, "the install did not finish"
            time.sleep(0.05)
        out = run(sb, code, timeout_ms=2000)
        assert out.kind == "return" and out.value == "&lt;", (out.kind, out.message)
    finally:
        sb.close()


# --- children never decide what the host installs or how often a tool runs

FORGED_REPORT = (
    "import gc, os, sys\n"
    "def handle(i, c):\n"
    "    c.audit('ran')\n"
    "    link = next(o for o in gc.get_objects() if type(o).__name__ == '_Link')\n"
    "    proto = sys.modules['protocol']\n"
    "    frame = {'op': 'result', 'run': link.run, 'kind': 'exception',\n"
    "             'type': 'ModuleNotFoundError', 'message': \"No module named 'numpy'\",\n"
    "             'phase': 'load', 'needed_packages': ['numpy', 'regex'],\n"
    "             'stdout': '', 'stderr': ''}\n"
    "    link.sock.sendall(proto.encode(frame))\n"
    "    os._exit(0)\n"
    "    return 1"
)


def test_a_forged_missing_package_report_installs_nothing_and_reruns_nothing(
    python: Sandbox,
) -> None:
    link = Link()
    out = run(python, FORGED_REPORT, link=link)
    assert out.kind == "exception" and out.error_type == "ModuleNotFoundError", out
    assert link.audits == ["ran"]  # the tool ran once
    assert not (python.packages.root / "numpy").exists()
    assert not (python.packages.root / "regex").exists()
    assert python.packages.installing() == []


def test_a_computed_import_of_a_listed_package_is_the_tools_error(python: Sandbox) -> None:
    code = "import importlib\ndef handle(i, c):\n    return importlib.import_module('bs' + '4')"
    link = Link()
    out = run(python, code, link=link)
    assert out.kind == "exception" and out.error_type == "ModuleNotFoundError"
    assert "import bs4" in out.message and "call the tool again" not in out.message
    assert not (python.packages.root / "bs4").exists()


# --- an install never blocks a call that does not need it, and a wait has the call's deadline


def test_an_install_in_progress_holds_up_only_the_calls_that_need_it(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "pkgs")
    pip, release = store.fetch, threading.Event()

    def numpy_never_ends(spec: str, staging: Path) -> str | None:
        if spec == "numpy==2.3.5":  # its install is under way until the test ends
            release.wait()
            return "the test is over"
        return pip(spec, staging)

    store.fetch = numpy_never_ends
    sb = python_sandbox(store, warm=2, name="pkgs-slow")
    try:
        needs_numpy = "def handle(i, c):\n    import numpy\n    return 1"
        out = run(sb, needs_numpy, timeout_ms=1000)
        assert out.kind == "infra" and "still being installed" in out.message, out
        # Meanwhile a call without packages, and one needing another package, run.
        assert run(sb, "def handle(i, c):\n    return 2", timeout_ms=1000).value == 2
        other = "def handle(i, c):\n    import regex\n    return bool(regex.match(r'\\p{L}', 'a'))"
        out = run(sb, other)
        assert out.kind == "return" and out.value is True, (out.kind, out.message)
        assert store.installing() == ["numpy==2.3.5"]
    finally:
        release.set()
        sb.close()


def test_a_failed_install_is_infra_and_not_retried_by_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real pip with nowhere to install from (no index, an empty wheel directory)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    (tmp_path / "no-wheels").mkdir()
    store = PackageStore(tmp_path / "pkgs")
    pip, fetched = store.fetch, []

    def counted(spec: str, staging: Path) -> str | None:
        fetched.append(spec)
        return pip(spec, staging)

    store.fetch = counted
    sb = python_sandbox(store, warm=1, name="pkgs-fail")
    try:
        code = "def handle(i, c):\n    import pytz\n    return 1"
        first = run(sb, code, timeout_ms=20000)
        assert first.kind == "infra" and "pip failed installing pytz" in first.message, first
        outs = [run(sb, code, timeout_ms=2000) for _ in range(2)]
        assert [o.kind for o in outs] == ["infra"] * 2
        assert fetched == ["pytz==2025.2"]  # the later calls were answered from memory
    finally:
        sb.close()


# --- JavaScript: the same rules


@pytest.mark.skipif(
    SHAPE is not None and not Path.home().joinpath(".npmrc").exists(),
    reason="npm here reaches its registry through settings in root's own ~/.npmrc",
)
def test_a_listed_javascript_package_required_inside_a_function_works_at_once(
    tmp_path: Path,
) -> None:
    sb = javascript_sandbox(JsPackageStore(tmp_path / "js"), warm=1, name="pkgs-js")
    try:
        code = (
            "function handle(i, c) {\n"
            "  if (true) { const dayjs = require('dayjs');\n"
            "    return dayjs('2026-01-31').add(1, 'month').format('YYYY-MM-DD'); }\n"
            "}"
        )
        out = run(sb, code)
        assert out.kind == "return" and out.value == "2026-02-28", (out.kind, out.message)
    finally:
        sb.close()
