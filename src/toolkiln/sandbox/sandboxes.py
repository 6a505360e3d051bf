"""The two sandboxes a runner hosts: the jailed runner with a Python or a JavaScript runtime."""

from __future__ import annotations

from typing import Any

from toolkiln.sandbox.javascript_runtime import JavaScriptRuntime
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.python_runtime import PythonRuntime
from toolkiln.sandbox.runner import Sandbox


def python_sandbox(packages: PackageStore, **options: Any) -> Sandbox:
    """Python: a process per call (``Sandbox`` takes ``limits``, ``warm``, ``strict``,
    ``name``)."""
    return Sandbox(PythonRuntime(), packages, **{"name": "py", **options})


def javascript_sandbox(packages: JsPackageStore, **options: Any) -> Sandbox:
    """JavaScript: ``warm`` long-lived workers, each serving one workspace."""
    return Sandbox(JavaScriptRuntime(), packages, **{"name": "js", **options})
