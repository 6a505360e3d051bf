"""What reaches a log: no credential, whichever library logs it; and how a line looks
(``configure``: text, or one JSON object per line with the trace's ids).

Two parts of the redaction, installed once per process by the composition root
(``toolkiln.app.build``):

- Every log record is redacted when it is made, before any handler or filter sees it (a
  log record factory, so it holds for every logger, every handler and every library
  version, whatever name it logs under): the userinfo of any URL (``scheme://user:pass@``),
  the value of an ``Authorization``-style ``Bearer``/``Basic`` credential, Toolkiln tokens
  (``tk_...``), and every secret value the service was configured with (``protect``: API
  keys, passwords, the SMTP and database URLs' credentials, and the path segments of the
  model endpoint's and search provider's URLs that may be tokens) become ``[redacted]``, in
  the message, its arguments and a logged exception's text.
- The HTTP client libraries' own loggers (``httpx``, ``httpx2``, ``httpcore``,
  ``httpcore2``, ``openai``), which log every request's URL at INFO and headers at DEBUG,
  are raised to WARNING: their lines are noise in a service log and the reason an
  endpoint's URL was logged at every generation.

``tests/security/test_log_secrets.py`` runs a generation and a search with every logger at
DEBUG and finds no secret in any record.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from opentelemetry import trace

REDACTED = "[redacted]"
NOISY = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "hpack")
# A configured value shorter than this is not looked for on its own (it would blank common
# words); inside a URL's userinfo it is redacted all the same.
MIN_SECRET_CHARS = 6
# A URL path segment at least this long may be a token (``/t0k3n-9f8e.../v1``): looked for.
MIN_PATH_SECRET_CHARS = 8

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s'\"<>]+@")
_AUTH = re.compile(r"(?i)\b(bearer|basic)(\s+|%20)[a-z0-9._~+/=-]{8,}")
_TOKEN = re.compile(r"\btk_[A-Za-z0-9_-]{16,}")

_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()
_installed = False


def protect(*values: str | None) -> None:
    """Values that must never reach a log, looked for as they are and URL-quoted."""
    global _secrets
    found = set()
    for value in values:
        if not value or len(value) < MIN_SECRET_CHARS:
            continue
        found |= {value, quote(value, safe=""), unquote(value)}
    with _lock:
        _secrets = _secrets | {v for v in found if len(v) >= MIN_SECRET_CHARS}


def credentials_of_url(url: str | None) -> list[str]:
    """A configured URL's user, password and query values (``smtp://u:p@host?from=...``)."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        out = [parts.username, parts.password]
    except ValueError:
        return [url]
    out += [pair.partition("=")[2] for pair in parts.query.split("&")]
    return [v for v in out if v]


def secrets_of_url(url: str | None) -> list[str]:
    """What of an endpoint's URL may be a credential: ``credentials_of_url``, and its path
    segments long enough to be tokens."""
    if not url:
        return []
    try:
        path = urlsplit(url).path
    except ValueError:
        return [url]
    long = [s for s in path.split("/") if len(s) >= MIN_PATH_SECRET_CHARS]
    return credentials_of_url(url) + long


def redact(text: str) -> str:
    text = _USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _AUTH.sub(rf"\1\2{REDACTED}", text)
    text = _TOKEN.sub(REDACTED, text)
    for secret in sorted(_secrets, key=len, reverse=True):  # a longer one may hold a shorter
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def install(quiet: Iterable[str] = NOISY) -> None:
    """Redact every record made from now on in this process (once), and quiet ``quiet``."""
    global _installed
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    with _lock:
        if _installed:
            return
        _installed = True
        made = logging.getLogRecordFactory()

    def redacted(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = made(*args, **kwargs)
        _redact_record(record)
        return record

    logging.setLogRecordFactory(redacted)


def _redact_record(record: logging.LogRecord) -> None:
    """Arguments are redacted one by one, keeping the record's shape (formatters such as
    uvicorn's access log read them); when the message they make still holds a secret (in
    the format string, or through a ``%r``), the record becomes that message redacted."""
    if record.args:
        record.args = _redact_args(record.args)
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not format: nothing of them is kept
        record.msg, record.args = f"{redact(str(record.msg))} [arguments not shown]", ()
    else:
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact(text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


def _redact_args(args: Any) -> Any:
    if isinstance(args, Mapping):
        return {k: _redact_arg(v) for k, v in args.items()}
    return tuple(_redact_arg(a) for a in args)


def _redact_arg(arg: Any) -> Any:
    if arg is None or isinstance(arg, bool | int | float):
        return arg
    try:
        text = str(arg)
    except Exception:
        return arg  # getMessage fails on it too, and then nothing of it is kept
    clean = redact(text)
    return arg if clean == text else clean


LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``trace_id`` and ``span_id`` (of the span current where the line was
    logged, as OpenTelemetry spells them; null outside a span or with traces off), and
    ``exception`` when one was logged. The record was redacted when it was made; an
    exception's text is redacted here too."""

    def format(self, record: logging.LogRecord) -> str:
        span = trace.get_current_span().get_span_context()
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": f"{span.trace_id:032x}" if span.is_valid else None,
            "span_id": f"{span.span_id:016x}" if span.is_valid else None,
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self.formatException(record.exc_info))
        if record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = redact(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: int, log_format: str = "text") -> None:
    """The process's root handler: standard error, as text or JSON lines
    (``TOOLKILN_LOG_FORMAT``; an unknown value is text, and refused by the settings)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
