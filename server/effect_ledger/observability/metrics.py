"""Prometheus metrics (``serve --metrics-listen HOST:PORT``; off by default).

Per call (the guard, through observer.py): RPCs by method and status code, their latency by
method, decisions by outcome and first reason code. Per policy evaluation (policy.py): latency
and errors. Per connection checkout: the database pool's connections in use, and its size.
Sampled by one background task every ``--metrics-sample-interval-seconds`` with bounded queries
(``storage/metrics_store.py``): open and UNKNOWN effects per tenant, pending approval requests
per tenant and the age of the oldest.

One server process serves its own endpoint. With ``--workers N`` the workers write their
metrics to files in a folder the supervisor made (prometheus-client's multiprocess mode,
``PROMETHEUS_MULTIPROC_DIR``) and the supervisor serves the endpoint, adding up the workers'
counters and histograms. Gauges sampled from the database are set by worker 0 only (it runs
the sampler, as it runs the lease sweeper) and exported as its latest value; the pool gauges
are summed over the live workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import start_http_server

log = logging.getLogger(__name__)

MULTIPROCESS_DIRECTORY_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
RPC_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
POLICY_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# The sampled gauges name at most this many tenants each (those with the most): a bound on the
# series one scrape returns, and on the rows each sampling query returns.
SAMPLED_TENANTS_MAX = 1000


class BadMetricsAddress(Exception):
    """A --metrics-listen that is not HOST:PORT."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) -> (host, port); port 0 picks a free one."""
    host, separator, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise BadMetricsAddress(f"--metrics-listen must be HOST:PORT, not {listen!r}")
    return host, int(port_text)


def multiprocess_directory() -> str | None:
    """The folder of the multiprocess mode when this process writes its metrics there."""
    return os.environ.get(MULTIPROCESS_DIRECTORY_VARIABLE) or None


@dataclass
class LedgerSample:
    """One sampling of the ledger: per tenant, (open, unknown) effects and (pending, oldest
    pending age in seconds) approval requests."""

    effects: dict[str, tuple[int, int]]
    approvals: dict[str, tuple[int, float]]


class Metrics:
    """This process's metrics, registered in a registry of their own."""

    def __init__(self) -> None:
        # No ``*_created`` series: a scrape is long enough as it is.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess_directory() is not None
        registry = self.registry
        self.rpcs = Counter(
            "effect_ledger_rpcs",
            "Guarded RPCs that ended, by method and status code.",
            ["method", "code"],
            registry=registry,
        )
        self.rpc_seconds = Histogram(
            "effect_ledger_rpc_duration_seconds",
            "Time from a guarded RPC's start to its end, by method.",
            ["method"],
            buckets=RPC_SECONDS_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "effect_ledger_decisions",
            "AuthorizeEffect decisions answered, by outcome and first reason code.",
            ["outcome", "reason"],
            registry=registry,
        )
        self.policy_seconds = Histogram(
            "effect_ledger_policy_evaluation_duration_seconds",
            "Time of one policy evaluation, by engine and package.",
            ["engine", "package"],
            buckets=POLICY_SECONDS_BUCKETS,
            registry=registry,
        )
        self.policy_errors = Counter(
            "effect_ledger_policy_evaluation_errors",
            "Policy evaluations that gave no valid decision, by engine and reason.",
            ["engine", "reason"],
            registry=registry,
        )
        self.schedules_moved = Counter(
            "effect_ledger_scheduled_intents_moved",
            "Scheduled intents this process's scheduler moved, by the state it moved them to.",
            ["state"],
            registry=registry,
        )
        self.pool_checked_out = Gauge(
            "effect_ledger_database_pool_checked_out_connections",
            "Database connections in use (summed over workers).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.pool_size = Gauge(
            "effect_ledger_database_pool_size_connections",
            "Database connections the pools may hold (summed over workers).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        sampled: dict[str, Any] = {"registry": registry, "multiprocess_mode": "livemostrecent"}
        self.effects_open = Gauge(
            "effect_ledger_effects_open",
            "Effects in an open stage (AUTHORIZED, DISPATCHED, UNKNOWN), per tenant (sampled).",
            ["tenant"],
            **sampled,
        )
        self.effects_unknown = Gauge(
            "effect_ledger_effects_unknown",
            "Effects whose outcome is UNKNOWN, per tenant (sampled).",
            ["tenant"],
            **sampled,
        )
        self.approvals_pending = Gauge(
            "effect_ledger_approval_requests_pending",
            "Approval requests pending and not expired, per tenant (sampled).",
            ["tenant"],
            **sampled,
        )
        self.approvals_oldest_age = Gauge(
            "effect_ledger_approval_requests_oldest_pending_age_seconds",
            "Age of the oldest pending approval request, per tenant (sampled).",
            ["tenant"],
            **sampled,
        )
        self.sampled_at = Gauge(
            "effect_ledger_ledger_sampled_timestamp_seconds",
            "When the sampled gauges were last set (Unix time).",
            **sampled,
        )
        # Label children by their values: labels() validates and locks on every call.
        self._rpc_children: dict[tuple[str, str], Any] = {}
        self._rpc_seconds_children: dict[str, Any] = {}
        self._decision_children: dict[tuple[str, str], Any] = {}
        # The tenants each kind of sampled gauge has a series for.
        self._sampled: dict[str, set[str]] = {"effects": set(), "approvals": set()}

    def observe_call(self, method: str, code: str, seconds: float) -> None:
        counter = self._rpc_children.get((method, code))
        if counter is None:
            counter = self._rpc_children[(method, code)] = self.rpcs.labels(method, code)
        counter.inc()
        histogram = self._rpc_seconds_children.get(method)
        if histogram is None:
            histogram = self._rpc_seconds_children[method] = self.rpc_seconds.labels(method)
        histogram.observe(seconds)

    def observe_schedules(self, moved: dict[str, int]) -> None:
        for state, count in moved.items():
            self.schedules_moved.labels(state).inc(count)

    def observe_decision(self, outcome: str, reason: str) -> None:
        counter = self._decision_children.get((outcome, reason))
        if counter is None:
            counter = self._decision_children[(outcome, reason)] = self.decisions.labels(outcome, reason)
        counter.inc()

    def watch_pool(self, sync_engine: Any) -> None:
        """Keep the pool gauges current: its size now, its connections in use counted at every
        checkout and checkin (an invalidated connection is checked in too)."""
        from sqlalchemy import event

        size = getattr(sync_engine.pool, "size", None)
        if callable(size):
            self.pool_size.set(size())
        in_use = self.pool_checked_out
        event.listen(sync_engine, "checkout", lambda *_arguments: in_use.inc())
        event.listen(sync_engine, "checkin", lambda *_arguments: in_use.dec())

    def set_ledger(self, sample: LedgerSample, now_seconds: float) -> None:
        """Set the sampled gauges; a tenant no longer in the sample goes to 0 (and, in one
        process, its series is removed)."""
        for tenant, (open_count, unknown_count) in sample.effects.items():
            self.effects_open.labels(tenant).set(open_count)
            self.effects_unknown.labels(tenant).set(unknown_count)
        for tenant, (pending, oldest_age) in sample.approvals.items():
            self.approvals_pending.labels(tenant).set(pending)
            self.approvals_oldest_age.labels(tenant).set(oldest_age)
        gauges = {
            "effects": (self.effects_open, self.effects_unknown),
            "approvals": (self.approvals_pending, self.approvals_oldest_age),
        }
        present = {"effects": set(sample.effects), "approvals": set(sample.approvals)}
        for kind, kind_gauges in gauges.items():
            for tenant in self._sampled[kind] - present[kind]:
                for gauge in kind_gauges:
                    if self.multiprocess:
                        gauge.labels(tenant).set(0)  # a file's series cannot be removed
                    else:
                        with contextlib.suppress(KeyError):
                            gauge.remove(tenant)
            self._sampled[kind] = present[kind]
        self.sampled_at.set(now_seconds)


class MetricsEndpoint:
    """``GET /metrics`` on its own port, in a thread of its own."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = parse_listen(listen)
        try:
            self._server, self._thread = start_http_server(port, host, registry)
        except OSError as error:
            raise BadMetricsAddress(f"cannot serve metrics on {listen}: {error.strerror or error}") from None
        self.host = host
        self.port = int(self._server.server_port)
        shown = f"[{host}]" if ":" in host else host
        log.info("serving metrics on http://%s:%d/metrics", shown, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_endpoint(listen: str, metrics: Metrics) -> MetricsEndpoint:
    return MetricsEndpoint(listen, metrics.registry)


@contextlib.contextmanager
def supervisor_endpoint(listen: str) -> Iterator[str]:
    """For a supervisor: a fresh folder for its workers' metrics (exported to them as
    PROMETHEUS_MULTIPROC_DIR), and the endpoint that adds them up; both gone on exit. Yields
    the folder."""
    from prometheus_client import multiprocess

    folder = tempfile.mkdtemp(prefix="effect-ledger-metrics-")
    previous = os.environ.get(MULTIPROCESS_DIRECTORY_VARIABLE)
    os.environ[MULTIPROCESS_DIRECTORY_VARIABLE] = folder
    endpoint = None
    try:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=folder)
        endpoint = MetricsEndpoint(listen, registry)
        yield folder
    finally:
        if endpoint is not None:
            endpoint.close()
        if previous is None:
            os.environ.pop(MULTIPROCESS_DIRECTORY_VARIABLE, None)
        else:
            os.environ[MULTIPROCESS_DIRECTORY_VARIABLE] = previous
        shutil.rmtree(folder, ignore_errors=True)


def worker_exited(folder: str, pid: int) -> None:
    """A worker is gone: its gauges of the live modes no longer count."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, folder)


async def sample_ledger(database: Any, metrics: Metrics, interval_seconds: float) -> None:
    """Set the sampled gauges now, then every ``interval_seconds``."""
    from effect_ledger.storage import metrics_store

    failing = False
    while True:
        try:
            sample, now = await database.run(
                lambda unit: metrics_store.sample(unit.connection, unit.now, SAMPLED_TENANTS_MAX)
            )
            metrics.set_ledger(LedgerSample(*sample), now.timestamp())
            if failing:
                log.info("sampling the ledger's gauges works again")
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the gauges keep their last values; retried
            if not failing:
                log.warning("sampling the ledger's gauges failed: %s: %s", type(error).__name__, error)
            failing = True
        await asyncio.sleep(interval_seconds)
