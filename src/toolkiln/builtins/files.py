"""``surface_file``: store content a tool made and return a signed, expiring download URL."""

from __future__ import annotations

import base64
import binascii
import mimetypes
from typing import Any

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec
from toolkiln.domain.ids import rfc3339
from toolkiln.services.files import (
    MAX_FILE_BYTES,
    MIME_TYPE_PATTERN,
    FileService,
    QuotaExceeded,
    safe_filename,
)


class SurfaceFile:
    spec = BuiltinSpec(
        "surface_file",
        "Store a file for the user and return {file_id, url, expires_at}; the URL is signed "
        "and expires after an hour. Give exactly one of content (text) or content_base64.",
        {
            "type": "object",
            "properties": {
                "filename": {"type": "string", "minLength": 1, "maxLength": 255},
                "content": {"type": "string"},
                "content_base64": {"type": "string"},
                "mime_type": {
                    "type": "string",
                    "maxLength": 127,
                    "pattern": MIME_TYPE_PATTERN,
                },
            },
            # "Exactly one of content, content_base64" is checked in call(): providers refuse
            # a top-level oneOf in a tool's parameters.
            "required": ["filename"],
            "additionalProperties": False,
        },
        effects=True,
    )

    def __init__(self, files: FileService) -> None:
        self._files = files

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        given = [k for k in ("content", "content_base64") if k in payload]
        if len(given) != 1:
            raise BuiltinFailure(
                "invalid_input",
                "give exactly one of content or content_base64",
                {"field": "content", "message": "give exactly one of content or content_base64"},
            )
        if "content" in payload:
            data = payload["content"].encode("utf-8")
        else:
            try:
                data = base64.b64decode(payload["content_base64"], validate=True)
            except (binascii.Error, ValueError):
                raise BuiltinFailure(
                    "invalid_input", "content_base64 is not base64", {"field": "content_base64"}
                ) from None
        if len(data) > MAX_FILE_BYTES:
            raise BuiltinFailure("too_large", f"files are capped at {MAX_FILE_BYTES} bytes")
        filename = safe_filename(payload["filename"])
        mime = (
            payload.get("mime_type")
            or mimetypes.guess_type(filename)[0]
            or "application/octet-stream"
        )
        call.cost["bytes"] = len(data)
        try:
            stored = self._files.store(call.workspace_id, filename, data, mime)
        except QuotaExceeded as exc:
            raise BuiltinFailure("quota_exceeded", str(exc)) from None
        return {**stored, "expires_at": rfc3339(stored["expires_at"])}
