"""``toolkiln``: serve, migrate, and manage workspaces and tokens locally.

The CLI acts with the local user's access to the data directory and configuration, so its
commands need no token.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from toolkiln import logs, telemetry
from toolkiln.api import serialize
from toolkiln.cli import generate
from toolkiln.cli import runner as runner_cli
from toolkiln.cli.local import Local, locate, open_local
from toolkiln.config import SettingError, Settings
from toolkiln.domain.errors import ServiceUnavailable, ToolkilnError
from toolkiln.domain.limits import MAX_TIMEOUT_MS

if TYPE_CHECKING:
    from toolkiln.app import Runtime

# Commands that need the whole service (sandbox, built-ins); the others run on ``Local``.
FULL = ("serve", "mcp", "generate")

log = logging.getLogger("toolkiln")
# Beyond the longest tool timeout: writing results, nested calls' bookkeeping.
DRAIN_MARGIN_S = 5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolkiln", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API, MCP endpoint, view (/ui) and sandbox pools")
    serve.add_argument("--host", help="address to listen on (default TOOLKILN_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default TOOLKILN_PORT or 8080)")

    sub.add_parser("migrate", help="apply database migrations and exit")

    mcp = sub.add_parser("mcp", help="serve an agent's tools over MCP on stdio")
    mcp.add_argument("--agent", required=True, help="agent id")
    mcp.add_argument(
        "--mode", choices=("direct", "code"), default="direct", help="code: one run_program tool"
    )
    mcp.add_argument(
        "--names",
        choices=("id", "name"),
        default="id",
        help="name: custom tools under their own names where they can be (else custom_{id})",
    )

    generate.add_parser(sub)
    runner_cli.add_parser(sub)

    ws = sub.add_parser("workspace", help="manage workspaces").add_subparsers(
        dest="action", required=True
    )
    ws_create = ws.add_parser("create", help="create a workspace")
    ws_create.add_argument("name")
    ws.add_parser("list", help="list workspaces")

    tok = sub.add_parser("token", help="manage tokens").add_subparsers(dest="action", required=True)
    tok_create = tok.add_parser("create", help="create a token and print it once")
    tok_create.add_argument("--workspace", required=True, help="workspace id or name")
    tok_create.add_argument("--scopes", default="read,write,invoke", help="comma-separated")
    tok_create.add_argument("--name")
    tok_revoke = tok.add_parser("revoke", help="revoke a token at once")
    tok_revoke.add_argument("token_id")
    tok_list = tok.add_parser("list", help="list tokens (never their values)")
    tok_list.add_argument("--workspace")
    return p


def _print(obj: object) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _serve(runtime: Runtime, sock: socket.socket) -> None:
    import uvicorn

    from toolkiln.app import build_app

    settings = runtime.settings
    bootstrap = settings.bootstrap_token
    issued = runtime.services.access.bootstrap(bootstrap.get_secret_value() if bootstrap else None)
    if issued is not None and bootstrap is None:
        # Printed once, to the terminal only; it is never logged.
        print(
            f"Created workspace 'default' and an admin token (shown only now):\n  {issued.value}\n",
            file=sys.stderr,
            flush=True,
        )
    # On SIGTERM uvicorn stops listening, closes idle connections and waits for the calls in
    # flight (each bounded by its own timeout, at most MAX_TIMEOUT_MS) to answer; only then
    # does the lifespan end, closing the sandbox pools and the database.
    # JSON lines: uvicorn's own loggers go to the root handler (logs.configure), unformatted
    # by uvicorn's configuration.
    config = uvicorn.Config(
        build_app(runtime),
        log_config=None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        log_level="info",
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=MAX_TIMEOUT_MS // 1000 + DRAIN_MARGIN_S,
    )
    _freeze_startup_heap()  # the app is built: what is made from here on is the calls' own
    with sock:
        uvicorn.Server(config).run(sockets=[sock])


def _freeze_startup_heap() -> None:
    """What start-up made (~200k objects: modules, the app, its routes and models) lives as
    long as the process: out of the collector's sight, so that a full collection walks only
    what the calls made since. Walking it all held the GIL for ~130-150 ms on the reference
    VM, a stall of every call in flight whenever one ran (docs/decisions/111-invoke-route.md)."""
    import gc

    gc.collect()
    gc.freeze()


def _listen(host: str, port: int) -> socket.socket:
    """Bound here, not by uvicorn, so that a taken port is a one-line error like the rest."""
    sock = None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise ServiceUnavailable(
            f"Cannot listen on {host}:{port} ({exc.strerror or exc}).", code="cannot_listen"
        ) from exc
    return sock


def _fail(code: str, message: str, details: object = None) -> int:
    """docs/configuration.md: one line, ``error: <code>: <message>``, and exit status 2."""
    print(f"error: {code}: {' '.join(message.split())}", file=sys.stderr)
    if details:
        print(json.dumps(details, indent=2), file=sys.stderr)
    return 2


def _start(args: argparse.Namespace) -> Runtime | Local:
    try:
        settings = Settings()
    except ValidationError as exc:
        raise ServiceUnavailable(_setting_problem(exc), code="invalid_setting") from exc
    logs.configure(args.log_level, settings.log_format)
    settings = locate(settings, args.command)
    if args.command not in FULL:
        local = open_local(settings)
        if local.migrated_to and args.command == "migrate":
            print(f"migrated the database to revision {local.migrated_to}", file=sys.stderr)
        return local
    from toolkiln.app import build

    if args.command == "serve":
        # The address given on the command line is the service's, for its links too (a file
        # link named the default port when --port said another).
        where = {"host": args.host or settings.host, "port": args.port or settings.port}
        settings = settings.model_copy(update=where)
        # Bound first: a taken port fails before migrations and sandbox pools start.
        args.listening = _listen(settings.host, settings.port)
    return build(settings, sandbox=True)


def _setting_problem(exc: ValidationError) -> str:
    """``TOOLKILN_X: what is wrong``, for the first problem pydantic found."""
    first = exc.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, SettingError):  # a rule between settings names its own variable
        return str(cause)
    name = "TOOLKILN_" + "_".join(str(p) for p in first["loc"]).upper()
    return f"{name}: {first['msg'].removeprefix('Value error, ')}"


def _run_full(args: argparse.Namespace, runtime: Runtime) -> None:
    if args.command == "serve":
        _serve(runtime, args.listening)
    elif args.command == "mcp":
        from toolkiln.mcp_server.stdio import serve_stdio

        serve_stdio(runtime.services, args.agent, args.mode, runtime.loops(), args.names)
    elif args.command == "generate":
        generate.run(runtime.services, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from toolkiln.sandbox.jail import linux
    from toolkiln.sandbox.userns import drop_capabilities

    drop_capabilities()  # an unprivileged service holds none (docs/deployment.md)
    if args.command == "runner":
        given = list(sys.argv[1:] if argv is None else argv)
        return runner_cli.main(given[given.index("runner") + 1 :])
    # Not dumpable: no process of the same uid (the embedded runner of an unprivileged API)
    # reads its /proc/<pid>/environ, memory or descriptors, or traces it. Not the runner's
    # rule: newuidmap writes its maps only while it is
    # (tests/security/test_embedded_unprivileged.py).
    linux.prctl(linux.PR_SET_DUMPABLE, 0)
    # Commands print their answer; only the server logs what it does as it goes.
    level = logging.INFO if args.command == "serve" else logging.WARNING
    logs.configure(level)  # as TOOLKILN_LOG_FORMAT says once the settings are read (_start)
    args.log_level = level
    # Alembic logs each step at INFO; a start that migrates says so in one line instead
    # (toolkiln.app.build; `migrate` prints it), as docs/configuration.md has it.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # The HTTP clients' loggers are quieted, and every record redacted, by toolkiln.logs
    # (installed by toolkiln.app.build).
    try:
        runtime = _start(args)
    except ToolkilnError as exc:
        return _fail(exc.code, exc.message)
    except Exception as exc:  # a start-up failure is one line, not a traceback
        log.debug("start-up failed", exc_info=exc)
        return _fail("startup_failed", f"{type(exc).__name__}: {exc}")
    try:
        _run(args, runtime)
        return 0
    except ToolkilnError as exc:
        return _fail(exc.code, exc.message, exc.details)
    finally:
        # What spans are buffered are sent first: an MCP client stops a stdio server 2 s
        # after closing its input (the SDK's grace), and closing the runtime (its runner)
        # may take longer; the spans need nothing of it.
        telemetry.shutdown()
        runtime.close()


def _run(args: argparse.Namespace, runtime: Runtime | Local) -> None:
    if not isinstance(runtime, Local):
        _run_full(args, runtime)
        return
    access = runtime.access
    if args.command == "migrate":
        print("database is at the newest migration")
    elif args.command == "workspace" and args.action == "create":
        # The API's shapes (POST /v1/workspaces, /v1/tokens): the CLI "does the same".
        _print(serialize.workspace(access.create_workspace(None, args.name)))
    elif args.command == "workspace" and args.action == "list":
        _print([serialize.workspace(w) for w in access.resolve_all()])
    elif args.command == "token" and args.action == "create":
        workspace = access.resolve_workspace(args.workspace)
        issued = access.create_token(None, workspace.id, args.scopes, args.name)
        _print(serialize.token(issued.record, issued.value))
    elif args.command == "token" and args.action == "revoke":
        access.revoke_token(None, args.token_id)
        print(f"revoked {args.token_id}")
    elif args.command == "token" and args.action == "list":
        ws_id = access.resolve_workspace(args.workspace).id if args.workspace else None
        tokens = access.all_tokens(ws_id)
        _print([{**serialize.token(t), "revoked": t.revoked_at is not None} for t in tokens])


if __name__ == "__main__":
    raise SystemExit(main())
