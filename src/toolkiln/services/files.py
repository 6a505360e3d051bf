"""Files surfaced by tools: stored in the database, served by signed, expiring URLs.

In the database (not the data directory) so that any replica serves a link another made.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from toolkiln.domain.errors import Forbidden, NotFound
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.services.background import Loop, periodic
from toolkiln.services.ports import UnitOfWorkFactory

log = logging.getLogger("toolkiln.files")

MAX_FILE_BYTES = 10 * 1024 * 1024
DEFAULT_TTL_S = 3600
# What one workspace may hold in files whose link has not expired (expired ones are deleted
# by ``pruner``): a workspace cannot fill the database the others share.
QUOTA_BYTES = 256 * 1024 * 1024
QUOTA_FILES = 10_000
PRUNE_EVERY_S = 600.0
PRUNE_BATCH = 500
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]")
# A media type as RFC 6838 names them (ASCII letters, digits and its few marks), so that it
# goes into a Content-Type header as it is: "text/plain\n" or "text/文字" passed a pattern of
# \w and $ and could then not be sent (a dropped connection, a 500).
_MIME_NAME = "[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
MIME_TYPE_PATTERN = f"^{_MIME_NAME}/{_MIME_NAME}$"
_MIME_TYPE = re.compile(f"{_MIME_NAME}/{_MIME_NAME}")
FALLBACK_MIME_TYPE = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class ServedFile:
    content: bytes
    filename: str
    mime_type: str


class QuotaExceeded(Exception):
    """The workspace holds its quota of files whose links have not expired."""


class FileService:
    def __init__(
        self,
        uow: UnitOfWorkFactory,
        key: bytes,
        base_url: str = "",
        quota_bytes: int = QUOTA_BYTES,
        quota_files: int = QUOTA_FILES,
    ) -> None:
        self._uow = uow
        self._key = key
        self._base_url = base_url.rstrip("/")
        self.quota_bytes = quota_bytes
        self.quota_files = quota_files

    def _sig(self, file_id: str, expires: int) -> str:
        return hmac.new(self._key, f"{file_id}.{expires}".encode(), hashlib.sha256).hexdigest()

    def store(
        self,
        workspace_id: str,
        filename: str,
        content: bytes,
        mime_type: str,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> dict[str, Any]:
        file_id = new_id()
        now = utcnow()
        expires_at = now + timedelta(seconds=ttl_s)
        with self._uow() as tx:
            count, size = tx.files.held(workspace_id, now)
            # Checked, then written: calls storing at the same moment may each pass it, by
            # one file of at most MAX_FILE_BYTES each. tests/security/test_file_quota.py.
            if count + 1 > self.quota_files or size + len(content) > self.quota_bytes:
                raise QuotaExceeded(
                    f"this workspace holds {count} files of {size} bytes whose links have not "
                    f"expired; its quota is {self.quota_files} files and {self.quota_bytes} bytes"
                )
            tx.files.add(
                {
                    "id": file_id,
                    "workspace_id": workspace_id,
                    "filename": filename,
                    "mime_type": mime_type,
                    "size": len(content),
                    "sha256": hashlib.sha256(content).hexdigest(),
                    "created_at": now,
                    "expires_at": expires_at,
                    "content": content,
                }
            )
        expires = int(expires_at.timestamp())
        sig = self._sig(file_id, expires)
        url = f"{self._base_url}/v1/files/{file_id}?expires={expires}&sig={sig}"
        return {"file_id": file_id, "url": url, "expires_at": expires_at}

    def open(self, file_id: str, expires: str, sig: str) -> ServedFile:
        """A tampered, expired or unknown link is refused with Forbidden (403)."""
        try:
            when = int(expires)
        except ValueError:
            raise Forbidden("The link is not valid.") from None
        # Compared as bytes: compare_digest refuses text that is not ASCII (a link whose
        # sig holds such a character is refused, not a 500).
        given = sig.encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(self._sig(file_id, when).encode(), given) or when < time.time():
            raise Forbidden("The link is not valid or has expired.")
        with self._uow(readonly=True) as tx:
            record = tx.files.get(file_id)
        if record is None or record["expires_at"] < datetime.now(UTC):
            raise NotFound("No such file.")
        if record.get("content") is None:  # stored on disk before migration 0008
            raise NotFound("No such file.")
        return ServedFile(
            bytes(record["content"]), record["filename"], served_type(record["mime_type"])
        )

    def prune(self, before: datetime | None = None) -> int:
        """Delete the files whose link has expired (before ``before``, now), a batch per
        transaction, so that no call's write waits long behind it; how many."""
        gone = 0
        while True:
            with self._uow() as tx:
                batch = tx.files.prune(before or utcnow(), PRUNE_BATCH)
            gone += batch
            if batch < PRUNE_BATCH:
                return gone


# What a stored file is served as: a type no browser runs, whatever loads it (a script or
# module, a worker, a style sheet, a document, a frame). A file's bytes are the tool's, and
# it is served from the view's origin: a `.js` file stored as text/javascript ran in /ui
# under its policy's `script-src 'self'` (tests/security/test_file_types.py and
# tests/web/test_stored_files.py). Images, audio and video (but SVG, which is a document)
# keep their type, so `_render` images show; anything else is application/octet-stream.
INERT_TYPES = frozenset(
    {
        "text/plain",
        "text/csv",
        "text/tab-separated-values",
        "text/markdown",
        "text/calendar",
        "application/json",
        "application/pdf",
        "application/zip",
        "application/gzip",
        "application/x-tar",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "application/vnd.ms-excel",
        "application/msword",
        FALLBACK_MIME_TYPE,
    }
)
_MEDIA = ("image/", "audio/", "video/")
_ACTIVE_MEDIA = frozenset({"image/svg+xml"})


def served_type(value: object) -> str:
    """The Content-Type a stored file is served with: its own if that is one of the inert
    types, else application/octet-stream."""
    kind = safe_mime_type(value).lower()
    if kind in INERT_TYPES or (kind.startswith(_MEDIA) and kind not in _ACTIVE_MEDIA):
        return kind
    return FALLBACK_MIME_TYPE


def safe_mime_type(value: object) -> str:
    """``value`` if it is a media type a header can carry, else application/octet-stream
    (files stored before the pattern was narrowed are served so)."""
    if isinstance(value, str) and _MIME_TYPE.fullmatch(value):
        return value
    return FALLBACK_MIME_TYPE


def safe_filename(name: str) -> str:
    """A filename fit for a Content-Disposition header and a download folder."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _SAFE_NAME.sub("_", base).strip(" .")
    return cleaned[:120] or "file"


def pruner(files: FileService, every_s: float = PRUNE_EVERY_S) -> Loop:
    """A loop (``services.background``) that deletes expired files at start and then every
    ``every_s``. Every replica runs one; a deletion another made already deletes nothing."""
    return periodic(files.prune, every_s, "deleted %d files whose links had expired", log)
