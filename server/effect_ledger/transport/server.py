"""The grpc.aio server: services, health, reflection, limits, background tasks, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from effect_ledger.config import ServerSettings
from effect_ledger.observability import metrics as observed_metrics
from effect_ledger.observability import tracing
from effect_ledger.observability.observer import Observer
from effect_ledger.observability.policy import observed
from effect_ledger.policy.engine import PolicyEngine
from effect_ledger.service import argument_checks, retention, schedules
from effect_ledger.service.approvals import ApprovalSettings
from effect_ledger.service.checkpoints import KeySettings
from effect_ledger.service.gate import Gate
from effect_ledger.service.leases import sweep_expired_leases
from effect_ledger.storage import key_store, round_trips
from effect_ledger.storage import repository as repo
from effect_ledger.storage.dialect import database_now
from effect_ledger.storage.engine import Database
from effect_ledger.transport.guard import Guard
from effect_ledger.transport.ports import CannotListen, check_port_free
from effect_ledger.transport.servicers import (
    Application,
    GateServicer,
    RunsServicer,
    ToolRegistryServicer,
)
from effect_ledger.transport.servicers_approvals import ApprovalsServicer, BudgetsServicer
from effect_ledger.transport.servicers_checkpoints import (
    CheckpointsServicer,
    load_signing_key,
    load_verification_key,
)
from effect_ledger.transport.servicers_principals import PrincipalsServicer
from effect_ledger.transport.servicers_retention import RetentionServicer
from effect_ledger.transport.servicers_schedules import SchedulesServicer
from effectledger.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    budgets_pb2,
    budgets_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    principals_pb2,
    principals_pb2_grpc,
    retention_pb2,
    retention_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

log = logging.getLogger(__name__)

# Calls above the guard's admission limit that gRPC still accepts: health checks, and the
# calls the guard refuses with RESOURCE_EXHAUSTED.
HEALTH_RESERVE_RPCS = 64
# gRPC's cap on the health port (--health-listen), its only limit: a probe makes one call at a
# time, and the port is for the host's or the pod network's probes only (never published).
HEALTH_PORT_CONCURRENT_RPCS_MAX = 16
# A health service name that is SERVING while the process serves, whatever its database does
# (NOT_SERVING once it drains): for liveness probes that can only ask "SERVING?" (the kubelet's
# grpc probe), so a database outage takes replicas out of a Service without restarting them.
LIVENESS_SERVICE_NAME = "liveness"

SERVICE_NAMES = (
    gate_pb2.DESCRIPTOR.services_by_name["Gate"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["Runs"].full_name,
    tools_pb2.DESCRIPTOR.services_by_name["ToolRegistry"].full_name,
    approvals_pb2.DESCRIPTOR.services_by_name["Approvals"].full_name,
    budgets_pb2.DESCRIPTOR.services_by_name["Budgets"].full_name,
    checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"].full_name,
    principals_pb2.DESCRIPTOR.services_by_name["Principals"].full_name,
    schedules_pb2.DESCRIPTOR.services_by_name["Schedules"].full_name,
    retention_pb2.DESCRIPTOR.services_by_name["Retention"].full_name,
)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    database: Database
    policy: PolicyEngine
    health: health.aio.HealthServicer
    tasks: list[asyncio.Task] = field(default_factory=list)
    metrics_endpoint: observed_metrics.MetricsEndpoint | None = None
    # The health port (--health-listen) and its bound port number, when configured.
    health_server: grpc.aio.Server | None = None
    health_port: int | None = None

    async def stop(self, grace_seconds: float) -> None:
        await self.health.enter_graceful_shutdown()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.server.stop(grace_seconds)
        if self.health_server is not None:
            # Last: it answered NOT_SERVING through the drain above.
            await self.health_server.stop(0)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        argument_checks.CHECKER.close()
        await self.policy.close()
        await self.database.dispose()
        round_trips.write()  # the benchmark's counts, when it asked for them


async def _health_monitor(database: Database, servicer: health.aio.HealthServicer, interval: float) -> None:
    """NOT_SERVING while the database does not answer; SERVING again by itself when it does."""
    serving = None
    while True:
        ok = await database.ping()
        if ok != serving:
            state = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", *SERVICE_NAMES):
                await servicer.set(name, state)
            log.log(logging.INFO if ok else logging.WARNING, "database %s", "reachable" if ok else "UNREACHABLE")
            serving = ok
        await asyncio.sleep(interval)


async def _sweep_one(unit, *, tenant_id: str, effect_id: str) -> None:  # type: ignore[no-untyped-def]
    await sweep_expired_leases(unit, tenant_id, effect_id)


async def _lease_sweeper(database: Database, interval: float, batch: int) -> None:
    """Record lease expiries by the database clock, so UNKNOWN shows up without a caller."""
    while True:
        await asyncio.sleep(interval)
        try:

            async def find(unit):
                return await repo.expired_lease_effects(unit.connection, await database_now(unit.connection), batch)

            for tenant_id, effect_id in await database.run(find):
                await database.run(functools.partial(_sweep_one, tenant_id=tenant_id, effect_id=effect_id))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - keep sweeping; the next pass retries
            log.warning("lease sweep failed: %s", error)


async def _statistics_keeper(database: Database, interval: float) -> None:
    """Do autovacuum's work where it is off: keep the planner's statistics fresh and vacuum
    tables with many dead rows (see ``Database.maintain_tables``); at start, then every
    ``interval`` seconds."""
    while True:
        try:
            vacuumed, analyzed = await database.maintain_tables()
            if vacuumed:
                log.debug("vacuumed %s (autovacuum is off)", ", ".join(vacuumed))
            if analyzed:
                log.debug("analyzed %s (autovacuum is off)", ", ".join(analyzed))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - statistics are an optimization; retry later
            log.warning("refreshing planner statistics failed: %s", error)
        await asyncio.sleep(interval)


def replica_name() -> str:
    """This process as a scheduler names itself in the schedules it fires: host/pid."""
    return f"{socket.gethostname()}/{os.getpid()}"[:128]


async def _scheduler(database: Database, interval: float, metrics: observed_metrics.Metrics | None) -> None:
    """Fire the scheduled intents that are due (by the database clock), expire the lapsed ones,
    every ``interval`` seconds; sooner again while a pass finds a full batch."""
    replica = replica_name()
    while True:
        moved: dict[str, int] = {}
        try:
            moved = await schedules.tick(database, replica)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - keep scheduling; the next pass retries
            log.warning("scheduler pass failed: %s", error)
        if moved:
            log.debug("scheduler moved %s", moved)
            if metrics is not None:
                metrics.observe_schedules(moved)
        await asyncio.sleep(0 if sum(moved.values()) >= schedules.FIRE_BATCH_MAX else interval)


async def _retention_collector(database: Database, interval: float) -> None:
    """Collect every tenant's aged, unreachable material every ``interval`` seconds (one worker
    per host; replicas share the work: the collector's batches skip rows another has locked)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await retention.collect_every_tenant(
                database, dry_run=False, batches_per_tenant_max=retention.BATCHES_PER_CALL_MAX
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - keep collecting; the next pass retries
            log.warning("retention collection failed: %s", error)


async def start_server(
    settings: ServerSettings,
    database: Database,
    policy: PolicyEngine,
    *,
    reuse_port: bool = False,
    sweep_leases: bool = True,
    serve_metrics: bool = True,
) -> RunningServer:
    """Serve on ``settings.listen``. ``reuse_port``: share the port with sibling worker processes
    (SO_REUSEPORT; off for a lone server, so a second server on a taken port fails to start).
    ``sweep_leases``: run the lease sweeper and the statistics keeper here (one worker per host
    does, see workers.py), and the sampler of the ledger's gauges. ``serve_metrics``: serve
    ``settings.metrics_listen`` here (a worker does not: its supervisor serves every worker's)."""
    limits = settings.limits
    credentials = server_credentials(settings)  # first: a bad TLS file stops the start at once
    metrics = observed_metrics.Metrics() if settings.metrics_listen else None
    endpoint = None
    if metrics is not None:
        metrics.watch_pool(database.engine.sync_engine)
        if serve_metrics:
            endpoint = observed_metrics.serve_endpoint(settings.metrics_listen, metrics)
    policy = observed(policy, metrics)
    approval_settings = ApprovalSettings(
        ttl_seconds_default=settings.approval_ttl_seconds_default,
        ttl_seconds_max=settings.approval_ttl_seconds_max,
        arguments_size_max_bytes=limits.arguments_size_max_bytes,
        open_requests_per_tenant_max=limits.open_approval_requests_per_tenant_max,
    )
    app = Application(database, Gate(policy, limits, approval_settings, settings.reconcile_grace_seconds), limits)
    guard = Guard(
        settings.default_deadline_seconds,
        settings.maximum_concurrent_rpcs,
        limits,
        app.authenticate,
        observer=Observer(metrics),
    )
    # The tracing interceptor, when on, is outside the guard: the guard's work is in the RPC's span.
    tracer = tracing.server_interceptor()
    server = grpc.aio.server(
        interceptors=[guard] if tracer is None else [tracer, guard],
        # The guard admits maximum_concurrent_rpcs calls; gRPC's own cap sits above it, so that
        # health checks (never counted by the guard) are still answered when the guard is full.
        maximum_concurrent_rpcs=settings.maximum_concurrent_rpcs + HEALTH_RESERVE_RPCS,
        options=[
            ("grpc.max_receive_message_length", limits.message_size_max_bytes),
            ("grpc.max_send_message_length", limits.message_size_max_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    tools_pb2_grpc.add_ToolRegistryServicer_to_server(ToolRegistryServicer(app), server)
    approvals_servicer = ApprovalsServicer(app, approval_settings)
    approvals_pb2_grpc.add_ApprovalsServicer_to_server(approvals_servicer, server)
    budgets_pb2_grpc.add_BudgetsServicer_to_server(BudgetsServicer(app), server)
    keys = KeySettings(
        signer=load_signing_key(settings.checkpoint_signing_key),
        trusted=load_verification_key(settings.checkpoint_verification_key),
    )
    if keys.signer is None:
        # The deployment's own signing key exists from the first start (kept in the database,
        # shared by every replica; concurrent first starts agree on one, see key_store.active).
        await database.run(lambda unit: key_store.ensure_signing_key(unit.connection, unit.now))
    checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(CheckpointsServicer(app, policy, keys=keys), server)
    runs_pb2_grpc.add_RunsServicer_to_server(RunsServicer(app), server)
    principals_pb2_grpc.add_PrincipalsServicer_to_server(PrincipalsServicer(app), server)
    gate_pb2_grpc.add_GateServicer_to_server(GateServicer(app), server)
    schedules_pb2_grpc.add_SchedulesServicer_to_server(SchedulesServicer(app), server)
    retention_pb2_grpc.add_RetentionServicer_to_server(
        RetentionServicer(app, settings.retention_age_min_seconds), server
    )
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set(LIVENESS_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = _bind(server, settings.listen, credentials, reuse_port)
    health_server, health_port = None, None
    if settings.health_listen:  # bound before either server starts: a port in use stops the start
        health_server, health_port = health_port_server(settings.health_listen, health_servicer, reuse_port)
    await server.start()
    if health_server is not None:
        await health_server.start()
    running = RunningServer(
        server,
        port,
        database,
        policy,
        health_servicer,
        metrics_endpoint=endpoint,
        health_server=health_server,
        health_port=health_port,
    )
    running.tasks.append(asyncio.create_task(approvals_servicer.feed.run()))  # wakes WatchApprovals streams
    running.tasks.append(
        asyncio.create_task(_health_monitor(database, health_servicer, settings.health_check_interval_seconds))
    )
    if settings.scheduler_interval_seconds > 0:
        # Every process runs one (every replica, every worker): the database lets one fire each intent.
        running.tasks.append(asyncio.create_task(_scheduler(database, settings.scheduler_interval_seconds, metrics)))
    if sweep_leases:
        running.tasks.append(
            asyncio.create_task(
                _lease_sweeper(database, settings.lease_sweep_interval_seconds, limits.lease_sweep_batch_max)
            )
        )
        running.tasks.append(asyncio.create_task(_statistics_keeper(database, settings.statistics_interval_seconds)))
        if settings.retention_interval_seconds > 0:
            running.tasks.append(
                asyncio.create_task(_retention_collector(database, settings.retention_interval_seconds))
            )
        if metrics is not None:
            running.tasks.append(
                asyncio.create_task(
                    observed_metrics.sample_ledger(database, metrics, settings.metrics_sample_interval_seconds)
                )
            )
    host = settings.listen.rsplit(":", 1)[0]
    log.info("effect-ledger serving on %s:%d (%s)", host, port, transport_security(settings))
    if health_port is not None:
        health_host = settings.health_listen.rsplit(":", 1)[0]
        log.info("grpc.health.v1 alone on %s:%d (plaintext, no admission limits)", health_host, health_port)
    if settings.port_file:
        Path(settings.port_file).write_text(f"{port}\n")
    return running


def health_port_server(
    listen: str, servicer: health.aio.HealthServicer, reuse_port: bool
) -> tuple[grpc.aio.Server, int]:
    """A server for ``--health-listen``, not started, and its bound port: grpc.health.v1 alone,
    answered by ``servicer`` (the main port's, so a drain's NOT_SERVING shows here too).

    No guard and no credentials: a probe needs no token, and the kubelet's gRPC probe speaks
    neither TLS nor mTLS; health status is not secret. Its only limit is gRPC's cap of
    HEALTH_PORT_CONCURRENT_RPCS_MAX calls, so no flood of the main port (whose own cap counts
    health checks too) reaches it; bind it to loopback or the pod network, never publish it."""
    server = grpc.aio.server(
        maximum_concurrent_rpcs=HEALTH_PORT_CONCURRENT_RPCS_MAX,
        options=[("grpc.so_reuseport", 1 if reuse_port else 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return server, _bind(server, listen, None, reuse_port, flag="--health-listen")


def _bind(
    server: grpc.aio.Server,
    listen: str,
    credentials: grpc.ServerCredentials | None,
    reuse_port: bool,
    flag: str = "--listen",
) -> int:
    """Add the listening port; its number. A port in use is found here first, with a socket of
    our own, so the operator reads one line that says so rather than gRPC's generic failure."""
    if not reuse_port:
        check_port_free(listen, flag)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as error:  # gRPC's "Failed to bind to address ..."
        raise CannotListen(f"cannot listen on {listen}: {error}") from None
    if port == 0:  # older gRPC releases report a failed bind this way
        raise CannotListen(f"cannot listen on {listen}")
    return port


async def serve_forever(settings: ServerSettings, database: Database, policy: PolicyEngine, reload_policy=None) -> None:
    running = await start_server(settings, database, policy)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # SIGHUP reloads the embedded policy; with a remote OPA there is nothing here to reload (OPA
    # loads its own bundles), and the signal must not kill the process (its default action).
    loop.add_signal_handler(
        signal.SIGHUP, reload_policy or (lambda: log.info("SIGHUP: the policy is served by OPA; nothing to reload"))
    )
    await stop.wait()
    log.info("shutting down (grace %.1f s)", settings.grace_seconds)
    await running.stop(settings.grace_seconds)


# --- TLS -----------------------------------------------------------------------------------

# A certificate chain, a key or a CA bundle is a few KiB; a larger file is not one of those.
TLS_FILE_SIZE_MAX_BYTES = 1024 * 1024


def transport_security(settings: ServerSettings) -> str:
    """How the port speaks, for the log: plaintext, TLS, or TLS with client certificates."""
    if not settings.tls_certificate:
        return "plaintext"
    return "mTLS: client certificates required" if settings.tls_client_ca else "TLS"


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """The listening port's TLS credentials from ``settings.tls_*``; None for plaintext.

    Every file is read and checked here, at start (SystemExit with the file and what is wrong
    with it): gRPC itself would accept some broken files and fail each handshake instead.
    With a client CA, a client must present a certificate it signed (require_client_auth), so
    a handshake that completes carries a verified client certificate (see peer.py)."""
    certificate, key, client_ca = settings.tls_certificate, settings.tls_key, settings.tls_client_ca
    if bool(certificate) != bool(key) or (client_ca and not certificate):
        raise SystemExit("TLS needs --tls-cert and --tls-key together; --tls-client-ca needs both")
    if not certificate:
        return None
    chain_pem = _read_tls_file(certificate, "--tls-cert")
    key_pem = _read_tls_file(key, "--tls-key")
    chain = _load_certificates(chain_pem, certificate, "--tls-cert")
    _check_key_matches(key_pem, key, chain[0])
    if chain[0].not_valid_after_utc < datetime.now(UTC):
        log.warning(
            "the TLS certificate %s expired at %s: clients will refuse it",
            certificate,
            chain[0].not_valid_after_utc.isoformat(),
        )
    client_ca_pem = None
    if client_ca:
        client_ca_pem = _read_tls_file(client_ca, "--tls-client-ca")
        _load_certificates(client_ca_pem, client_ca, "--tls-client-ca")
    return grpc.ssl_server_credentials(
        [(key_pem, chain_pem)], root_certificates=client_ca_pem, require_client_auth=client_ca_pem is not None
    )


def _read_tls_file(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(TLS_FILE_SIZE_MAX_BYTES + 1)
    except OSError as error:
        raise SystemExit(f"{flag} {path}: cannot read it: {error.strerror or error}") from None
    if len(data) > TLS_FILE_SIZE_MAX_BYTES:
        raise SystemExit(f"{flag} {path}: larger than {TLS_FILE_SIZE_MAX_BYTES} bytes, not a PEM file")
    return data


def _load_certificates(data: bytes, path: str, flag: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise SystemExit(f"{flag} {path}: not a PEM certificate (-----BEGIN CERTIFICATE-----)") from None


def _check_key_matches(data: bytes, path: str, certificate: x509.Certificate) -> None:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SystemExit(f"--tls-key {path}: encrypted; give the key without a passphrase") from None
    except (ValueError, UnsupportedAlgorithm):
        raise SystemExit(f"--tls-key {path}: not a PEM private key") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise SystemExit(f"--tls-key {path}: not the key of the first certificate in --tls-cert")
