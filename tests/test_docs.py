"""Every setting and every CLI command is documented."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.deploy.podman import documented_run
from toolkiln.cli.main import _parser
from toolkiln.config import RunnerSettings, Settings


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in [*Settings.model_fields, *RunnerSettings.model_fields]:
        assert f"`TOOLKILN_{name.upper()}`" in text, name


def test_every_cli_command_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    parser = _parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, cmd in sub.choices.items():
        actions = [a for a in cmd._actions if a.dest == "action"]
        if not actions:
            assert f"`toolkiln {name}" in text, name
            continue
        for action in actions[0].choices:
            assert f"`toolkiln {name} {action}" in text, (name, action)


def test_every_table_is_documented() -> None:
    from toolkiln.storage.tables import metadata

    text = (ROOT / "docs" / "data-model.md").read_text()
    for name in metadata.tables:
        assert f"| `{name}` |" in text, name


def test_what_the_service_needs_is_said_one_way() -> None:
    """README, configuration.md and security.md say it in the same words, naming the
    capabilities the documented container runs with (tests/deploy/test_image.py)."""
    said = set()
    for page in ("README.md", "docs/configuration.md", "docs/security.md"):
        text = " ".join((ROOT / page).read_text().split())
        found = re.search(r"Toolkiln needs Linux .*? never host root itself\.", text)
        assert found, page
        said.add(found.group(0))
    assert len(said) == 1, said
    granted = next(w for w in documented_run() if w.startswith("--cap-add="))
    named = set(re.findall(r"`CAP_([A-Z_]+)`", said.pop()))
    assert named == set(granted.split("=", 1)[1].split(","))


def test_each_decision_record_is_numbered_as_named_and_indexed() -> None:
    """docs/decisions/NNN-title.md starts with "# NNN" and has a line in the index."""
    folder = ROOT / "docs" / "decisions"
    index = (folder / "README.md").read_text()
    for record in sorted(folder.glob("[0-9][0-9][0-9]-*.md")):
        number = record.name[:3]
        assert record.read_text().startswith(f"# {number}"), record.name
        assert f"]({record.name})" in index, f"{record.name} is not in the index"
