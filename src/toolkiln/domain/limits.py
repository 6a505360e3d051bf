"""Documented size caps and defaults (docs/api.md lists them)."""

from __future__ import annotations

MAX_BODY_BYTES = 1024 * 1024
MAX_CODE_CHARS = 256 * 1024
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 4096
MAX_STATUS_LINE_CHARS = 200
MAX_LABEL_CHARS = 200  # workspace, token and agent names
MAX_CALL_ID_CHARS = 128  # tool_call_id, conversation_id and other ids a client picks

DEFAULT_TIMEOUT_MS = 5000
MAX_TIMEOUT_MS = 30000
MIN_TIMEOUT_MS = 100

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_VERSION = 2**31 - 1  # version numbers are 32-bit integers in the database
MAX_CTX_NAME_CHARS = 128  # a name a ctx.tools call may give (a tool name, or custom_{id})

# What is read of an answer from outside before it is refused (toolkiln/outbound/).
LLM_ANSWER_BYTES = 8 * 1024 * 1024  # default of TOOLKILN_LLM_MAX_ANSWER_BYTES
