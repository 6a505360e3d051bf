"""The curated third-party packages tools may import, installed by the host, never by a tool.

Python packages live in ``<data dir>/packages/python`` and JavaScript packages in
``<data dir>/packages/javascript``; sandboxes see them read-only at ``/pkgs``.

Who decides (docs/security.md, "Packages"): the host, from the code's analysis (every
``import``, anywhere in it, and ``importlib.import_module``/``__import__``/``require``
with a literal name: domain/code_check.py, run by a code checker), installs the listed
packages it names: ahead of time when the code is saved (``prepare``), or before the first
call that needs them, which waits at most until its own deadline. Nothing a sandboxed
process reports changes what is installed or how often a tool runs. Each distribution has
a lock of its own, so one install never holds up a call that does not need that package.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

log = logging.getLogger("toolkiln.sandbox")

# import name -> the pinned distributions it needs (itself first).
PYTHON_PACKAGES: dict[str, list[str]] = {
    "dateutil": ["python-dateutil==2.9.0.post0", "six==1.17.0"],
    "pytz": ["pytz==2025.2"],
    "yaml": ["PyYAML==6.0.3"],
    "jinja2": ["Jinja2==3.1.6", "MarkupSafe==3.0.3"],
    "markupsafe": ["MarkupSafe==3.0.3"],
    "regex": ["regex==2025.11.3"],
    "bs4": ["beautifulsoup4==4.14.2", "soupsieve==2.8", "typing_extensions==4.15.0"],
    "six": ["six==1.17.0"],
    "numpy": ["numpy==2.3.5"],
}

# name -> (pinned version, its single-file UMD build inside the package)
JS_PACKAGES: dict[str, tuple[str, str]] = {
    "lodash": ("4.17.21", "lodash.js"),
    "dayjs": ("1.11.13", "dayjs.min.js"),
    "zod": ("3.23.8", "lib/index.umd.js"),
}

INSTALL_TIMEOUT_S = 600
RETRY_AFTER_FAILURE_S = 30.0  # a failed install is not retried by every call


class PackageStore:
    """The curated Python packages: which a tool needs, and installing them off the call path."""

    listed: tuple[str, ...] = tuple(PYTHON_PACKAGES)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._guard = threading.Lock()  # held only for bookkeeping, never during an install
        self._jobs: dict[str, Future[str | None]] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        # How one distribution gets into a staging directory (``spec, staging -> problem or
        # None``): the store's installer, pip or npm; tests put one in front that waits,
        # fails or counts.
        self.fetch: Callable[[str, Path], str | None] = self._fetch
        _readable(self.root)

    # --- what the runtimes call

    def listing(self) -> list[dict[str, str]]:
        seen: dict[str, str] = {}
        for specs in PYTHON_PACKAGES.values():
            for spec in specs:
                name, _, version = spec.partition("==")
                seen[name] = version
        return [
            {"name": n, "version": v} for n, v in sorted(seen.items(), key=lambda kv: kv[0].lower())
        ]

    def specs(self, import_names: Iterable[str]) -> list[str]:
        """The pinned distributions the listed names among ``import_names`` need."""
        return sorted(
            {spec for n in import_names if n in PYTHON_PACKAGES for spec in PYTHON_PACKAGES[n]}
        )

    def prepare(self, import_names: Iterable[str]) -> list[Future[str | None]]:
        """Start installing (in the background) whatever listed package is missing."""
        futures = []
        for spec in self.specs(import_names):
            if self.installed(spec):
                continue
            with self._guard:
                job = self._jobs.get(spec)
                failed = self._failed.get(spec)
                if job is None and failed is not None and time.monotonic() < failed[0]:
                    job = Future()
                    job.set_result(failed[1])
                elif job is None:
                    job = Future()
                    self._jobs[spec] = job
                    # A daemon thread per distribution: an install never delays shutdown.
                    threading.Thread(
                        target=self._run_job, args=(spec, job), name="package-install", daemon=True
                    ).start()
            futures.append(job)
        return futures

    def ensure(self, import_names: Iterable[str], deadline: float | None = None) -> list[str]:
        """Wait (at most until ``deadline``, a ``time.monotonic()`` value) for the listed
        packages the names need; returns the problems (empty when all are there)."""
        problems = []
        for job in self.prepare(import_names):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                problem = job.result(timeout=left)
            except FutureTimeout:
                problem = "a listed package this tool imports is still being installed"
            if problem and problem not in problems:
                problems.append(problem)
        return problems

    def install(self, import_names: Iterable[str]) -> list[str]:
        """Install now and wait: for operators and tests."""
        return self.ensure(import_names)

    def prefetch(self) -> None:
        """Start installing every listed package that is missing (e.g. at start-up)."""
        self.prepare(self.listed)

    def installing(self) -> list[str]:
        """The distributions whose install is under way."""
        with self._guard:
            return sorted(self._jobs)

    def installed(self, spec: str) -> bool:
        name, _, version = spec.partition("==")
        wanted = f"{_canonical(name)}-{version}.dist-info"
        try:
            return any(_canonical(e) == _canonical(wanted) for e in os.listdir(self.root))
        except OSError:
            return False

    # --- one distribution at a time per distribution (its job is its lock)

    def _run_job(self, spec: str, job: Future[str | None]) -> None:
        try:
            job.set_result(self._install(spec))
        except Exception as exc:  # an install that breaks must still answer its waiters
            log.exception("package install of %s broke", spec)
            job.set_result(f"installing {spec} failed: {exc}")

    def _install(self, spec: str) -> str | None:
        try:
            if self.installed(spec):
                return None
            with tempfile.TemporaryDirectory(prefix=".staging-", dir=self.root) as staging:
                problem = self.fetch(spec, Path(staging))
                if problem is None:
                    _readable(Path(staging))
                    self._move_in(Path(staging))
            if problem is not None:
                log.error("package install failed: %s", problem)
                with self._guard:
                    self._failed[spec] = (time.monotonic() + RETRY_AFTER_FAILURE_S, problem)
            return problem
        finally:
            with self._guard:
                self._jobs.pop(spec, None)

    def _fetch(self, spec: str, staging: Path) -> str | None:
        cmd = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--no-compile", "--target", str(staging), spec,
        ]  # fmt: skip
        log.info("installing sandbox package %s", spec)
        return _install("pip", spec, cmd)

    def _move_in(self, staging: Path) -> None:
        """Each top-level entry replaces its old copy with one rename. Distributions own
        disjoint entries and one job at a time installs each, so no lock is needed."""
        for entry in sorted(staging.iterdir()):
            if entry.name == "bin":
                continue
            target = self.root / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            entry.rename(target)


def _install(
    installer: str, what: str, cmd: list[str], env: dict[str, str] | None = None
) -> str | None:
    """Run one install command; the problem that stops it (out of time, or the end of its
    stderr), or None once it has installed ``what``."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return f"{installer} did not finish installing {what} in {INSTALL_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"{installer} failed installing {what}: {done.stderr.strip()[-500:]}"
    return None


def _canonical(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _readable(root: Path) -> None:
    """Sandboxed calls run as other uids: the tree must be world-readable whatever the umask."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | 0o444 | (0o111 if path.is_dir() else 0)
        if wanted != mode:
            path.chmod(wanted)


class JsPackageStore(PackageStore):
    """The curated JavaScript packages, installed by the host with npm (scripts disabled)
    into ``<data dir>/packages/javascript``, which JavaScript workers see read-only."""

    listed = tuple(JS_PACKAGES)

    def listing(self) -> list[dict[str, str]]:
        return [{"name": n, "version": v} for n, (v, _) in sorted(JS_PACKAGES.items())]

    def specs(self, import_names: Iterable[str]) -> list[str]:
        return sorted({n for n in import_names if n in JS_PACKAGES})

    def installed(self, spec: str) -> bool:
        return (self.root / "node_modules" / spec / JS_PACKAGES[spec][1]).is_file()

    def _fetch(self, spec: str, staging: Path) -> str | None:
        npm = shutil.which("npm")
        if npm is None:
            return "npm is not installed on the host"
        pinned = f"{spec}@{JS_PACKAGES[spec][0]}"
        cmd = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
               "--ignore-scripts", "--omit=dev", "--no-save", pinned]  # fmt: skip
        log.info("installing JavaScript package %s", pinned)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKILN_")}
        return _install("npm", pinned, cmd, env)

    def _move_in(self, staging: Path) -> None:
        """Only the package itself moves in (its UMD build has no dependencies)."""
        modules = self.root / "node_modules"
        modules.mkdir(exist_ok=True)
        _readable(modules)
        for package in (staging / "node_modules").iterdir():
            if package.name not in JS_PACKAGES:
                continue
            target = modules / package.name
            if target.exists():
                shutil.rmtree(target)
            package.rename(target)
