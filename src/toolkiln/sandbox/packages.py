"""The curated third-party packages tools may import, installed by the host on first use.

A package is installed (never by the tool) into ``<data dir>/packages/python``, which every
sandbox sees read-only at ``/pkgs``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
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


class PackageStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        _readable(self.root)

    def listing(self) -> list[dict[str, str]]:
        seen: dict[str, str] = {}
        for specs in PYTHON_PACKAGES.values():
            for spec in specs:
                name, _, version = spec.partition("==")
                seen[name] = version
        return [
            {"name": n, "version": v} for n, v in sorted(seen.items(), key=lambda kv: kv[0].lower())
        ]

    def install(self, import_names: list[str]) -> list[str]:
        """Install what the names need; returns the problems (empty when all went well)."""
        wanted = sorted(
            {spec for n in import_names if n in PYTHON_PACKAGES for spec in PYTHON_PACKAGES[n]}
        )
        if not wanted:
            return []
        with self._lock:
            cmd = [
                sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--only-binary=:all:", "--upgrade",
                "--target", str(self.root), *wanted,
            ]  # fmt: skip
            log.info("installing sandbox packages: %s", " ".join(wanted))
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            _readable(self.root)
        if done.returncode != 0:
            log.error("package install failed: %s", done.stderr[-2000:])
            return [f"pip failed installing {' '.join(wanted)}: {done.stderr.strip()[-500:]}"]
        return []


def _readable(root: Path) -> None:
    """Sandboxed calls run as other uids: the tree must be world-readable whatever the umask."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | 0o444 | (0o111 if path.is_dir() else 0)
        if wanted != mode:
            path.chmod(wanted)


# name -> (pinned version, its single-file UMD build inside the package)
JS_PACKAGES: dict[str, tuple[str, str]] = {
    "lodash": ("4.17.21", "lodash.js"),
    "dayjs": ("1.11.13", "dayjs.min.js"),
    "zod": ("3.23.8", "lib/index.umd.js"),
}


class JsPackageStore(PackageStore):
    """The curated JavaScript packages, installed by the host with npm (scripts disabled)
    into ``<data dir>/packages/javascript``, which JavaScript workers see read-only."""

    def listing(self) -> list[dict[str, str]]:
        return [{"name": n, "version": v} for n, (v, _) in sorted(JS_PACKAGES.items())]

    def installed(self, name: str) -> bool:
        entry = JS_PACKAGES[name][1]
        return (self.root / "node_modules" / name / entry).is_file()

    def install(self, import_names: list[str]) -> list[str]:
        wanted = sorted(
            f"{n}@{JS_PACKAGES[n][0]}"
            for n in import_names
            if n in JS_PACKAGES and not self.installed(n)
        )
        if not wanted:
            return []
        npm = shutil.which("npm")
        if npm is None:
            return ["npm is not installed on the host"]
        with self._lock:
            cmd = [npm, "install", "--prefix", str(self.root), "--no-audit", "--no-fund",
                   "--ignore-scripts", "--omit=dev", "--no-save", *wanted]  # fmt: skip
            log.info("installing JavaScript packages: %s", " ".join(wanted))
            env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKILN_")}
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=600, check=False, env=env
            )
            _readable(self.root)
        if done.returncode != 0:
            log.error("npm install failed: %s", done.stderr[-2000:])
            return [f"npm failed installing {' '.join(wanted)}: {done.stderr.strip()[-500:]}"]
        return []
