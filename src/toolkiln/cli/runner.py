"""``toolkiln runner --listen ADDR``: runs tool code for the API processes that connect.

Kept apart from the rest of the CLI so that a runner imports nothing of the API (no
database driver, no web framework): ``python -m toolkiln runner`` comes here directly.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import SecretStr, ValidationError

if TYPE_CHECKING:
    from toolkiln.config import RunnerSettings
    from toolkiln.sandbox.layers import Missing


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runner = sub.add_parser("runner", help="run tool code for API processes (no credential)")
    _arguments(runner)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", help="unix:/path or host:port (default TOOLKILN_RUNNER_LISTEN)")
    p.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the runner credential from the first line of standard input",
    )
    p.add_argument(
        "--map",
        metavar="START:COUNT",
        help="as the host's root: become root of a new user namespace mapped to host ids "
        "START.. before anything else (the embedded runner of a host-root API)",
    )
    p.add_argument(
        "--with-stdin",
        action="store_true",
        help="stop (drain) when standard input closes: the process that started it is gone",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkiln runner")
    _arguments(parser)
    args = parser.parse_args(argv)
    from toolkiln import logs
    from toolkiln.config import RunnerSettings

    logs.configure(logging.INFO)

    try:
        settings = RunnerSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "TOOLKILN_" + "_".join(str(p) for p in first["loc"]).upper()
        return _fail("invalid_setting", f"{name}: {first['msg']}")
    logs.configure(logging.INFO, settings.log_format)
    if args.token_stdin:
        settings.runner_token = SecretStr(sys.stdin.readline().strip())
    token = settings.runner_token.get_secret_value() if settings.runner_token else ""
    if not token:
        return _fail("invalid_setting", "TOOLKILN_RUNNER_TOKEN: a runner needs its credential")
    listen = args.listen or settings.runner_listen
    if not listen:
        return _fail("invalid_setting", "--listen (or TOOLKILN_RUNNER_LISTEN) is required")
    from toolkiln.sandbox.layers import refused

    missing = _own_namespace(settings, args.map)
    stopping = [] if settings.sandbox_insecure else refused(missing, settings.accepted_layers)
    if stopping:
        return _fail("sandbox_refused", "; ".join(m.refusal() for m in stopping))
    from toolkiln import telemetry
    from toolkiln.runners.process import serve
    from toolkiln.sandbox.pool import LayerRefused

    try:
        telemetry.configure()  # off without OTEL_* settings
        until = sys.stdin.fileno() if args.with_stdin else None
        serve(listen, settings, token, until, missing)
    except LayerRefused as exc:
        return _fail("sandbox_refused", str(exc))
    except Exception as exc:  # a start-up failure is one line, not a traceback
        logging.getLogger("toolkiln.runner").debug("start-up failed", exc_info=exc)
        return _fail("startup_failed", f"{type(exc).__name__}: {exc}")
    finally:
        telemetry.shutdown()
    return 0


def _own_namespace(settings: RunnerSettings, mapped: str | None) -> list[Missing]:
    """An unprivileged runner makes its own user namespace first, while it has one thread
    (sandbox/userns.py); so does a host-root one told a range (``--map``). Returns what it
    could not have without one: it stops the start unless accepted
    (tests/security/test_embedded_unprivileged.py)."""
    from toolkiln.sandbox import userns
    from toolkiln.sandbox.layers import Missing

    userns.drop_capabilities()  # what a container runtime handed an unprivileged user
    missing: list[Missing] = []
    if mapped is not None and userns.shape() == userns.HOST_ROOT:
        start, count = (int(x) for x in mapped.split(":"))
        own = (str(settings.data_dir.resolve()),)
        why = userns.enter_mapped_namespace(start, count, own)
        if why is not None:
            missing = [Missing("runner_uid", f"no user namespace: {why}")]
    elif settings.sandbox_insecure or userns.shape() != userns.UNPRIVILEGED:
        return []
    else:
        missing = userns.enter_own_namespace(settings.sandbox_subuids)
    for m in missing:
        if settings.sandbox_insecure or m.layer in settings.accepted_layers:
            logging.getLogger("toolkiln.runner").warning("accepted: %s", m.refusal())
    return missing


def _fail(code: str, message: str) -> int:
    print(f"error: {code}: {message}", file=sys.stderr)
    return 2
