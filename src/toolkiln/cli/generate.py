"""``toolkiln generate``: a tool from a description, with progress on standard error."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from toolkiln.domain.auth import Principal

if TYPE_CHECKING:  # imported when the command runs: other commands need not pay for them
    from toolkiln.services.container import Services


def add_parser(sub: Any) -> None:
    gen = sub.add_parser("generate", help="write a tool from a description with the model")
    gen.add_argument("--workspace", required=True, help="workspace id or name")
    gen.add_argument("--language", choices=["python", "javascript"], default="python")
    gen.add_argument("--name", help="the tool's name (default: the model's choice)")
    gen.add_argument("--save", action="store_true", help="create the tool from the draft")
    gen.add_argument("description", help="what the tool should do, in plain words")


def _progress(kind: str, data: dict[str, Any]) -> None:
    if kind == "attempt":
        line = f"attempt {data['attempt']} of {data['max_attempts']}: asking the model"
    elif kind == "validated":
        line = f"  {data['name']}: definition valid, running its examples"
    elif kind == "example":
        outcome = "ok" if data["passed"] else "FAILED"
        line = f"  example {data['index'] + 1}: {outcome}"
    elif kind == "problems":
        line = f"  {len(data['problems'])} problem(s), sent back to the model"
    else:
        return
    print(line, file=sys.stderr, flush=True)


def run(services: Services, args: argparse.Namespace) -> None:
    """The local user acts with write access to the workspace, like the rest of the CLI."""
    from toolkiln.api import serialize
    from toolkiln.services.generate import GenerateRequest, tool_draft_of

    workspace = services.access.resolve_workspace(args.workspace)
    who = Principal("local-cli", workspace.id, frozenset({"read", "write"}))
    wanted = GenerateRequest(workspace.id, args.description, args.language, args.name)
    draft = services.generate.generate(who, wanted, _progress)
    if args.save:
        tool = services.tools.create(who, workspace.id, tool_draft_of(draft))
        print(json.dumps(serialize.tool(tool), indent=2))
    else:
        print(json.dumps(draft, indent=2))
