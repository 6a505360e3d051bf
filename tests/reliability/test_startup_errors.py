"""Start-up and CLI failures: one line ``error: <code>: <message>`` and exit status 2
(docs/configuration.md), never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.reliability.harness import TOOLKILN, free_port


def toolkiln(*args: str, env: dict[str, str], wrap: list[str] | None = None):  # type: ignore[no-untyped-def]
    """The command with ``env`` as its only TOOLKILN_ settings, and a free port unless ``env``
    names one: `serve` must never try the default 8080, where the README's own service may
    be running (its `cannot_listen` would stand in for the error a test waits for)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKILN_")}
    return subprocess.run(
        [*(wrap or []), TOOLKILN, *args],
        env={**full, "TOOLKILN_PORT": str(free_port()), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {code}: "), lines[0]
    return lines[0]


def test_unreachable_database_is_one_line(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://root:hunter2@127.0.0.1:{free_port()}/nowhere"
    env = {"TOOLKILN_DATA_DIR": str(tmp_path), "TOOLKILN_DATABASE_URL": url}
    line = one_line_error(toolkiln("serve", env=env), "unavailable")
    assert "unreachable" in line and "hunter2" not in line


def _read_only(path: Path) -> list[str]:
    """A wrapper that runs the command with ``path`` read-only: a read-only bind mount in a
    mount namespace of its own as root (root ignores file modes), the file mode otherwise."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("read-only data dir as root needs util-linux unshare")
    script = f'mount --bind "{path}" "{path}" && mount -o remount,bind,ro "{path}" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh"]


@pytest.mark.parametrize(
    ("fresh", "command"), [(True, ["migrate"]), (False, ["serve"])], ids=["new", "existing"]
)
def test_read_only_data_dir_is_one_line(tmp_path: Path, fresh: bool, command: list[str]) -> None:
    data = tmp_path / "data"
    env = {"TOOLKILN_DATA_DIR": str(data)}
    data.mkdir()
    if not fresh:
        assert toolkiln("migrate", env=env).returncode == 0
    line = one_line_error(
        toolkiln(*command, env=env, wrap=_read_only(data)), "data_dir_not_writable"
    )
    assert str(data) in line


def test_bad_setting_is_one_line(tmp_path: Path) -> None:
    env = {"TOOLKILN_DATA_DIR": str(tmp_path), "TOOLKILN_PORT": "99999"}
    line = one_line_error(toolkiln("migrate", env=env), "invalid_setting")
    assert "TOOLKILN_PORT" in line


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"TOOLKILN_DATABASE_URL": "garbage"}, "TOOLKILN_DATABASE_URL"),
        ({"TOOLKILN_DATABASE_URL": "mysql://app@db/toolkiln"}, "TOOLKILN_DATABASE_URL"),
        ({"TOOLKILN_SEARCH_PROVIDER": "bing"}, "TOOLKILN_SEARCH_PROVIDER"),
        ({"TOOLKILN_SEARCH_PROVIDER": "searxng"}, "TOOLKILN_SEARCH_URL"),
        ({"TOOLKILN_SEARCH_PROVIDER": "brave"}, "TOOLKILN_SEARCH_API_KEY"),
        (
            {"TOOLKILN_SEARCH_PROVIDER": "searxng", "TOOLKILN_SEARCH_URL": "searx.local"},
            "TOOLKILN_SEARCH_URL",
        ),
        ({"TOOLKILN_SMTP_URL": "http://mail.example.org"}, "TOOLKILN_SMTP_URL"),
        ({"TOOLKILN_PUBLIC_URL": "tools.example.org"}, "TOOLKILN_PUBLIC_URL"),
        ({"TOOLKILN_LLM_BASE_URL": "localhost:11434/v1"}, "TOOLKILN_LLM_BASE_URL"),
        # e.g. `export TOOLKILN_FILE_SIGNING_KEY=$(cat /missing/file)`: links signed with
        # an empty HMAC key
        ({"TOOLKILN_FILE_SIGNING_KEY": ""}, "TOOLKILN_FILE_SIGNING_KEY"),
    ],
    ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else v,
)
def test_a_wrong_value_is_an_invalid_setting_naming_it(
    tmp_path: Path, settings: dict[str, str], named: str
) -> None:
    """docs/configuration.md: a wrong value is `error: invalid_setting: TOOLKILN_X: ...`.
    These were checked only when the service was built (`startup_failed` with the
    library's words: "ArgumentError: Could not parse SQLAlchemy URL", "ModuleNotFoundError:
    No module named 'MySQLdb'", "unknown search provider 'bing'"), or not at all (a public
    URL or model endpoint without a scheme, an empty signing key)."""
    env = {"TOOLKILN_DATA_DIR": str(tmp_path), **settings}
    line = one_line_error(toolkiln("migrate", env=env), "invalid_setting")
    assert line.startswith(f"error: invalid_setting: {named}: "), line


def test_command_refusal_is_one_line(tmp_path: Path) -> None:
    env = {"TOOLKILN_DATA_DIR": str(tmp_path)}
    one_line_error(toolkiln("token", "revoke", "no-such-token", env=env), "not_found")


def test_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"TOOLKILN_DATA_DIR": str(tmp_path), "TOOLKILN_PORT": str(port)}
        line = one_line_error(toolkiln("serve", env=env), "cannot_listen")
    assert f"127.0.0.1:{port}" in line
