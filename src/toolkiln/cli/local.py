"""What the CLI's database-only commands run on, and where the data directory is.

``workspace``, ``token`` and ``migrate`` need the database and the access service only. They
do not import the composition root (``toolkiln.app``): FastAPI, the MCP SDK, the sandbox and
the built-ins cost about a second and a half of imports per command, for nothing.

The data directory: ``TOOLKILN_DATA_DIR`` (or ``TOOLKILN_DATABASE_URL``) when set; else the
``data`` directory holding a ``toolkiln.db`` in the current directory or the nearest parent,
as ``git`` finds its repository, so a command run anywhere in the project reaches the
database ``toolkiln serve`` (started at the project's root) uses. ``serve`` and ``migrate``
create ``./data`` when there is none; every other command refuses to start with a fresh,
empty database and says where it looked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkiln.config import Settings
from toolkiln.domain.errors import NotFound
from toolkiln.services.access import AccessService
from toolkiln.storage.database import Database

DB_FILE = "toolkiln.db"
CREATES_DATA = ("serve", "migrate")


@dataclass(slots=True)
class Local:
    """The database and the access service, for the commands that need nothing else."""

    settings: Settings
    database: Database
    access: AccessService
    migrated_to: str | None

    def close(self) -> None:
        self.database.dispose()


def open_local(settings: Settings) -> Local:
    settings.ensure_data_dir()
    database = Database(settings.resolved_database_url(), pool_size=2)
    migrated_to = database.migrate()
    return Local(settings, database, AccessService(database.transaction), migrated_to)


def locate(settings: Settings, command: str, cwd: Path | None = None) -> Settings:
    """The settings with the data directory this command should use (see the module doc)."""
    explicit = {"data_dir", "database_url"} & settings.model_fields_set
    if explicit or settings.database_url:
        return settings
    here = (cwd or Path.cwd()).resolve()
    looked = [here, *here.parents]
    for folder in looked:
        if (folder / "data" / DB_FILE).is_file():
            return settings.model_copy(update={"data_dir": folder / "data"})
    if command in CREATES_DATA:
        return settings
    places = ", ".join(str(f / "data") for f in looked[:4]) + (" ..." if len(looked) > 4 else "")
    raise NotFound(
        f"No Toolkiln database found: looked for data/{DB_FILE} in {places}. Run this where "
        "`toolkiln serve` runs (or below it), or set TOOLKILN_DATA_DIR (or "
        "TOOLKILN_DATABASE_URL) to what the service uses.",
        code="no_data_dir",
    )
