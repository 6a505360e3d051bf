"""Traces: the OpenTelemetry SDK, configured from the standard ``OTEL_*`` variables.

Off unless the environment asks for an exporter: ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``, or both, comma-separated; ``none``: off) or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); and never with
``OTEL_SDK_DISABLED=true``. The OTLP protocol is ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the default, or ``grpc``); the
exporters read their own variables (endpoint, headers, timeout, certificates), the
provider its sampler (``OTEL_TRACES_SAMPLER``), the batch processor its limits
(``OTEL_BSP_*``), the resource ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
(``service.name`` is ``toolkiln`` unless they say otherwise). The spans themselves are
made in ``services/tracing.py``.

Configured once per process (the API's composition root, ``toolkiln runner``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import toolkiln
from toolkiln import logs
from toolkiln.services import tracing

if TYPE_CHECKING:  # the SDK is imported only when traces are on
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("toolkiln.telemetry")
EXPORTERS = ("otlp", "console")
PROTOCOLS = ("http/protobuf", "grpc")
# What of the API's OTEL_* configuration the embedded runner is not given: the exporter's
# credentials (headers, a client key). A runner holds no credential.
RUNNER_WITHHELD = ("HEADERS", "CLIENT_KEY", "CLIENT_CERTIFICATE")

_lock = threading.Lock()
_provider: TracerProvider | None = None


class TelemetryError(ValueError):
    """An ``OTEL_*`` value this service does not know."""


def wanted(env: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for (empty: traces are off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        found = [n.strip() for n in named.split(",") if n.strip()]
        if found == ["none"]:
            return []
        unknown = [n for n in found if n not in EXPORTERS]
        if unknown:
            raise TelemetryError(
                f"OTEL_TRACES_EXPORTER: {unknown[0]!r} is not one of {', '.join(EXPORTERS)}"
            )
        return found
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ["otlp"]
    return []


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # Standard error, as log lines: standard output may be a protocol's channel
        # (``toolkiln mcp`` speaks MCP on it).
        return ConsoleSpanExporter(out=sys.stderr)
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in PROTOCOLS:
        raise TelemetryError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def configure(
    *,
    record_io: bool = False,
    env: Mapping[str, str] | None = None,
    processors: list[SpanProcessor] | None = None,
) -> TracerProvider | None:
    """Traces for this process as the environment says (``processors``: instead of the
    exporters it names, for tests); the provider, or None when traces are off. A second
    call keeps the first one's provider."""
    global _provider
    env = os.environ if env is None else env
    with _lock:
        if _provider is not None:
            return _provider
        names = wanted(env) if processors is None else ["given"]
        if not names:
            tracing.use(None)
            return None
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "toolkiln"}
        provider = TracerProvider(resource=Resource.create(attributes))
        for processor in processors or [BatchSpanProcessor(_exporter(n, env)) for n in names]:
            provider.add_span_processor(processor)
        tracing.use(
            provider.get_tracer("toolkiln", toolkiln.__version__),
            record_io=record_io,
            redact=logs.redact,
        )
        _provider = provider
        log.info("traces are exported (%s)", ", ".join(names))
        return provider


def shutdown() -> None:
    """Export what is buffered and stop making spans."""
    global _provider
    with _lock:
        provider, _provider = _provider, None
        tracing.use(None)
    if provider is not None:
        provider.shutdown()


def runner_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables the embedded runner is started with: the API's, less the
    exporter's credentials."""
    env = os.environ if env is None else env
    return {
        k: v
        for k, v in env.items()
        if k.startswith("OTEL_") and not any(part in k for part in RUNNER_WITHHELD)
    }
