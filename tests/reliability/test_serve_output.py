"""What ``toolkiln serve`` writes on its first start (docs/configuration.md: migrations
print no Alembic log, whichever command runs them)."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.harness import Serve


def test_the_first_serve_of_a_data_dir_prints_no_alembic_log(tmp_path: Path) -> None:
    """It printed ~20 INFO lines of Alembic's ("setup plugin alembic.autogenerate...",
    "Running upgrade 0001 -> 0002, ..."): serve logs at INFO, and Alembic's loggers with
    it. One line says what happened instead."""
    serve = Serve(tmp_path / "data", {"TOOLKILN_BOOTSTRAP_TOKEN": "tk_output-admin"})
    try:
        serve.wait_ready()
    finally:
        serve.terminate()
    output = serve.log.read_text()
    assert "alembic" not in output, output
    assert "migrated the database to revision" in output, output
