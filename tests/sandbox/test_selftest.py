"""The start-up self-test proves each layer by what the kernel holds for a warm process
(sandbox/selftest.py): a layer a process does not show is reported missing, whatever the
template said of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkiln.sandbox import selftest
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox, python_sandbox

MB = 1024 * 1024


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sandbox]]:
    base = tmp_path_factory.mktemp("selftest")
    python = python_sandbox(PackageStore(base / "py"), warm=1)
    javascript = javascript_sandbox(JsPackageStore(base / "js"), warm=1)
    yield {"python": python, "javascript": javascript}
    python.close()
    javascript.close()


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_full_jail_proves_every_layer(boxes: dict[str, Sandbox], language: str) -> None:
    box = boxes[language]
    for template in box.templates():
        assert selftest.prove(template, box.limits.memory_mb * MB) == []
    assert box.missing_layers() == []


def test_a_layer_the_process_does_not_show_is_missing(boxes: dict[str, Sandbox]) -> None:
    """The same warm processes, judged against values they do not have: each check reads
    the process, not the configuration alone."""
    box = boxes["python"]
    template = box.template
    memory = box.limits.memory_mb * MB
    layers = {m.layer for m in selftest.prove(template, memory + MB)}
    assert layers == {"cgroup"}  # its slot's memory limit is not that
    real = template.config
    try:
        template.config = real.replace(uid_base=real.uid_base + real.uid_count)
        assert {m.layer for m in selftest.prove(template, memory)} == {"uid"}
        template.config = real.replace(address_space_mb=real.address_space_mb + 1)
        assert {m.layer for m in selftest.prove(template, memory)} == {"rlimits"}
    finally:
        template.config = real


def test_the_checks_read_proc_of_the_process() -> None:
    """Against this test's own process (no jail at all), every check but the cgroup's
    finds something missing: namespaces shared, a writable root, no filter, no
    no_new_privs."""
    import os

    pid = os.getpid()
    assert selftest._namespaces(pid, None, 0)  # type: ignore[arg-type]
    assert selftest._seccomp(pid, None, 0)  # type: ignore[arg-type]
    assert selftest._no_new_privs(pid, None, 0)  # type: ignore[arg-type]
    root = [
        ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if ln.split()[4] == "/"
    ]
    writable = "rw" in root[0].split()[5].split(",")
    assert bool(selftest._readonly_root(pid, None, 0)) == writable  # type: ignore[arg-type]
