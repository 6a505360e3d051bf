"""``toolkiln generate`` as a user runs it: a real process, a real data directory, the scripted
model on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.api.test_generate import DESCRIPTION, cagr
from tests.model_server import ScriptedModel, propose
from toolkiln.app import build
from toolkiln.config import Settings


def run(data_dir: Path, model: ScriptedModel, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TOOLKILN_DATA_DIR": str(data_dir),
        "TOOLKILN_LLM_BASE_URL": model.url,
        "TOOLKILN_LLM_MODEL": "scripted-model",
        "TOOLKILN_SANDBOX_WARM": "1",
        "TOOLKILN_SANDBOX_JS_WORKERS": "1",
    }
    env.pop("TOOLKILN_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "toolkiln.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_generate_saves_a_proven_tool(tmp_path: Path, model_server: ScriptedModel) -> None:
    # One process only: each start brings up the sandbox pools, which is most of its cost.
    made = build(Settings(data_dir=tmp_path), sandbox=False)
    made.services.access.create_workspace(None, "acme")
    made.close()
    model_server.script(propose(cagr(code="def main(**p):\n    return (\n")), propose(cagr()))
    saved = run(tmp_path, model_server, "generate", "--workspace", "acme", "--save", DESCRIPTION)
    assert saved.returncode == 0, saved.stderr
    assert "attempt 2 of 3" in saved.stderr and "example 1: ok" in saved.stderr
    assert "1 problem(s), sent back to the model" in saved.stderr
    tool = json.loads(saved.stdout)
    assert tool["name"] == "cagr-calculator" and tool["version"] == 1
    assert [c["name"] for c in tool["test_cases"]] == ["example 1"]
    assert len(model_server.requests) == 2
