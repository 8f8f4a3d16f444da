"""OpenTelemetry traces: off unless an exporter is configured (``serve --otel-exporter``).

- ``none`` (the default): no tracer; ``span`` is a shared no-op context manager and the gRPC
  server has no tracing interceptor.
- ``console``: spans as JSON on standard output (logs go to standard error).
- ``otlp``: spans to an OpenTelemetry collector over OTLP/gRPC, configured by the standard
  variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...); needs the
  package ``opentelemetry-exporter-otlp-proto-grpc`` (a dependency of this one).

The standard ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` and
``OTEL_BSP_*`` variables apply. Every RPC gets a server span (opentelemetry-instrumentation-grpc's
aio interceptor, outside the guard), with child spans for each policy evaluation
(``policy.evaluate``) and each database transaction (``db.transaction``). ``install`` puts a
tracer provider of the caller's (an in-memory exporter, in tests) in place of the configured one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

EXPORTERS = ("none", "console", "otlp")
SERVICE_NAME = "effect-ledger"
POLICY_SPAN = "policy.evaluate"
TRANSACTION_SPAN = "db.transaction"
# At shutdown, the spans still buffered get this long to be exported (an unreachable collector
# would otherwise hold the exit through its retries); what is left then is dropped.
SHUTDOWN_SECONDS_MAX = 3.0

log = logging.getLogger(__name__)

_provider: Any = None
_tracer: Any = None
_NO_SPAN = contextlib.nullcontext()


class BadExporter(Exception):
    """An --otel-exporter the server does not know, or one whose package is missing."""


def enabled() -> bool:
    return _tracer is not None


def install(provider: Any) -> None:
    """Trace with ``provider`` (an opentelemetry-sdk TracerProvider); None: stop tracing."""
    global _provider, _tracer
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer("effect_ledger")


def configure(exporter: str) -> None:
    """Set up the exporter named (one of EXPORTERS); ``none`` leaves tracing off."""
    if exporter not in EXPORTERS:
        raise BadExporter(f"--otel-exporter must be one of {', '.join(EXPORTERS)}, not {exporter!r}")
    if exporter == "none":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise BadExporter("--otel-exporter otlp needs the package opentelemetry-exporter-otlp-proto-grpc") from None
        span_exporter = OTLPSpanExporter()
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    # shutdown_on_exit=False: ``shutdown`` bounds the export at exit; the SDK's own exit hook would not.
    provider = TracerProvider(
        resource=Resource.create({} if named else {"service.name": SERVICE_NAME}), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    install(provider)


def shutdown(timeout_seconds: float = SHUTDOWN_SECONDS_MAX) -> None:
    """Stop tracing; export what is still buffered, for at most ``timeout_seconds``."""
    provider = _provider
    install(None)
    if provider is None:
        return
    exporting = threading.Thread(target=provider.shutdown, name="effect-ledger-trace-export", daemon=True)
    exporting.start()
    exporting.join(timeout_seconds)
    if exporting.is_alive():
        log.warning("the spans still buffered were not exported within %.1f s: dropped", timeout_seconds)


def span(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A child span of the current one, as a context manager; a no-op when tracing is off."""
    if _tracer is None:
        return _NO_SPAN
    return _tracer.start_as_current_span(name, attributes=attributes)


def server_interceptor() -> Any:
    """The gRPC aio server interceptor that starts each RPC's span; None when tracing is off."""
    if _provider is None:
        return None
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return aio_server_interceptor(tracer_provider=_provider)


def annotate_call(request_id: str) -> str:
    """Put the request id on the current RPC's span; its trace id (hex), "" without one."""
    from opentelemetry import trace

    current = trace.get_current_span()
    context = current.get_span_context()
    if not context.is_valid:
        return ""
    current.set_attribute("effect_ledger.request_id", request_id)
    return format(context.trace_id, "032x")
