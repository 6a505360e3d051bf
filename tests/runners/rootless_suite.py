"""Runs test files (the jail tests: tests/security, tests/sandbox) in a rootless runner shape:
the test process itself is the runner, as an unprivileged user that makes its own user
namespace (``subuid``) or as root of a user namespace mapped to an unprivileged host range
(``namespace-root``), with a cgroup delegated to it. ``make test-rootless``:

    python -m tests.runners.rootless_suite SHAPE [pytest arguments...]

Run by the host's root, which makes the test user, its range and the delegated cgroup
(tests/runners/rootless.py) and removes them after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.runners.rootless import RANGE, SHAPES, Delegated, make_host, why_not

KEPT = ("PATH", "LANG", "TOOLKILN_TEST_POSTGRES_URL")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SHAPES:
        print(f"usage: rootless_suite {{{','.join(SHAPES)}}} [pytest arguments]", file=sys.stderr)
        return 2
    if (why := why_not()) is not None:
        print(f"rootless_suite: {why}", file=sys.stderr)
        return 2
    shape, args = argv[0], argv[1:]
    host = make_host()
    uid = host.host_uid(shape)
    cgroup = Delegated(uid).make()
    temp = host.base / "pytest"
    temp.mkdir()
    os.chown(host.base, uid, uid)
    os.chown(temp, uid, uid)
    env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith("PIP_")}
    env |= {
        "HOME": str(host.base),
        "TOOLKILN_TEST_SHAPE": shape,
        "TOOLKILN_SANDBOX_CGROUP": cgroup.name,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    pytest = [str(host.python), "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={temp}"]
    if shape == "subuid":
        name = host.user.pw_name
        prefix = ["setpriv", "--reuid", name, "--regid", name, "--clear-groups"]
    else:
        launcher = Path(__file__).with_name("namespaced.py")
        prefix = [str(host.python), str(launcher), str(uid), str(RANGE), "--"]
    try:
        return subprocess.run([*prefix, *pytest, *args], cwd=ROOT, env=env, check=False).returncode
    finally:
        cgroup.remove()
        shutil.rmtree(host.base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
