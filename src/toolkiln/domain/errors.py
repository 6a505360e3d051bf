"""The one exception tree. Every refusal carries a stable machine-readable ``code``.

Only ``toolkiln.api`` knows which HTTP status each class maps to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ToolkilnError(Exception):
    """Root of every error the service reports to a client."""

    code = "error"

    def __init__(self, message: str, details: Any = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code


class Unauthenticated(ToolkilnError):
    """No token, or a token that is unknown or revoked."""

    code = "unauthorized"


class Forbidden(ToolkilnError):
    """The token lacks the scope the operation needs."""

    code = "forbidden"


class NotFound(ToolkilnError):
    """The object does not exist, or belongs to a workspace the caller cannot see."""

    code = "not_found"


class Conflict(ToolkilnError):
    """The change clashes with existing state (for example ``name_taken``)."""

    code = "conflict"


class InvalidRequest(ToolkilnError):
    """A well-formed JSON body that breaks the rules (HTTP 422)."""

    code = "validation_error"


class InvalidTool(InvalidRequest):
    """A tool definition with one or more problems, all listed in ``details``."""

    code = "invalid_tool"

    def __init__(self, problems: Sequence[Mapping[str, Any]]) -> None:
        n = len(problems)
        super().__init__(
            f"The tool definition has {n} problem{'s' if n != 1 else ''}.", list(problems)
        )


class PayloadTooLarge(ToolkilnError):
    """The request body is over the documented cap."""

    code = "payload_too_large"


class ServiceUnavailable(ToolkilnError):
    """A part the operation needs is not configured or not ready."""

    code = "unavailable"


class TestsFailed(InvalidRequest):
    """A write whose new version fails its own test cases; ``details`` has every case."""

    __test__ = False  # not a pytest class, whatever its name
    code = "tests_failed"

    def __init__(self, reports: Sequence[Mapping[str, Any]]) -> None:
        failed = sum(1 for r in reports if not r.get("passed"))
        super().__init__(
            f"{failed} of {len(reports)} test cases failed; nothing was stored.", list(reports)
        )


class TooManyRequests(ToolkilnError):
    """The workspace already has its share of long work (generations, test runs, programs)
    under way; ``retry_after_s`` says when to try again."""

    code = "too_many_requests"

    def __init__(self, message: str, details: Any = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s


class UpstreamFailed(ToolkilnError):
    """An outside service the operation needs (a model endpoint) failed or timed out."""

    code = "upstream_failed"


class LlmUnavailable(UpstreamFailed):
    """The model endpoint failed, answered nonsense, or did not answer in time."""

    code = "llm_unavailable"


class LlmNotConfigured(ServiceUnavailable):
    """No model endpoint is configured, so nothing can be generated."""

    code = "llm_not_configured"


class GenerationFailed(InvalidRequest):
    """Every proposal the model made had problems; ``details`` has the last ones."""

    code = "generation_failed"
