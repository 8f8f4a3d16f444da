"""Logs, metrics and traces of the server (docs/observability.md).

- ``calls``: what is known of the call in progress (its request id, who made it, how it ended).
- ``logs``: one renderer, text or JSON, for structlog's lines and the standard library's.
- ``observer``: what the guard reports when a call ends: its access line and its metrics.
- ``metrics``: Prometheus metrics, their endpoint, and the gauges sampled from the database.
- ``tracing``: OpenTelemetry spans, off unless an exporter is configured.
- ``policy``: the policy engine, timed, counted and traced.
"""
