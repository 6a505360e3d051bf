"""The egress fixtures (tests/egress/kit.py)."""

from tests.egress.kit import (  # noqa: F401
    ca,
    egress_client,
    egress_runtime,
    http,
    https,
    kit,
    language,
    other,
)
