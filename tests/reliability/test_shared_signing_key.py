"""File links work on every replica without TOOLKILN_FILE_SIGNING_KEY (CONTRACT 11): the
generated key lives in the database, so the replica that made a link and any other sign
and accept the same. Before, each replica generated its own into its data dir and refused
the others' links (403). A key an earlier version generated into a data dir seeds the
shared one, so the links that replica made stay valid."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from tests.conftest import PG_URL
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.domain.errors import Forbidden


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    """A database of this test's own: the key is the first replica's to store."""
    base = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    name = "toolkiln_t_signing_key"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_URL.rpartition('/')[0]}/{name}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def replica(data_dir: Path, url: str) -> Runtime:
    return build(Settings(data_dir=data_dir, database_url=url), sandbox=False)


def _open(rt: Runtime, link: dict) -> bytes:
    parts = urlsplit(link["url"])
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    file_id = parts.path.rsplit("/", 1)[1]
    return rt.services.files.open(file_id, query["expires"], query["sig"]).content


def test_a_link_made_by_one_replica_is_served_by_another(
    tmp_path: Path, fresh_postgres: str
) -> None:
    a = replica(tmp_path / "a", fresh_postgres)
    b = replica(tmp_path / "b", fresh_postgres)
    try:
        link = a.services.files.store("ws", "r.txt", b"from a", "text/plain")
        assert _open(b, link) == b"from a"
        back = b.services.files.store("ws", "r.txt", b"from b", "text/plain")
        assert _open(a, back) == b"from b"
        tampered = {**link, "url": link["url"].replace("sig=", "sig=0")}
        with pytest.raises(Forbidden):
            _open(b, tampered)
    finally:
        a.close()
        b.close()


def test_a_key_left_in_a_data_dir_by_an_earlier_version_keeps_its_links(
    tmp_path: Path, fresh_postgres: str
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "signing.key").write_text("an-earlier-generated-key\n")
    first = replica(old, fresh_postgres)
    try:
        link = first.services.files.store("ws", "r.txt", b"kept", "text/plain")
    finally:
        first.close()
    other = replica(tmp_path / "new", fresh_postgres)
    try:
        assert _open(other, link) == b"kept"
        assert other.database.shared_secret("file_signing_key", "x") == "an-earlier-generated-key"
    finally:
        other.close()
