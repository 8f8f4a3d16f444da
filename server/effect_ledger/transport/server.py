"""The grpc.aio server: services, health, reflection, limits, background tasks, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from effect_ledger import faults
from effect_ledger.config import ServerSettings
from effect_ledger.errors import DeadlineExceeded, LedgerError
from effect_ledger.policy.engine import PolicyEngine
from effect_ledger.service.gate import Gate
from effect_ledger.service.leases import sweep_expired_leases
from effect_ledger.storage import repository as repo
from effect_ledger.storage import key_store, round_trips
from effect_ledger.storage.dialect import database_now
from effect_ledger.storage.engine import Database
from effect_ledger.transport import status
from effect_ledger.transport.servicers import (
    Application,
    GateServicer,
    RunsServicer,
    ToolRegistryServicer,
)
from effect_ledger.service.approvals import ApprovalSettings
from effect_ledger.service.checkpoints import KeySettings
from effect_ledger.transport.servicers_approvals import ApprovalsServicer, BudgetsServicer
from effect_ledger.transport.servicers_checkpoints import (
    CheckpointsServicer,
    load_signing_key,
    load_verification_key,
)
from effectledger.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    budgets_pb2,
    budgets_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    gate_pb2.DESCRIPTOR.services_by_name["Gate"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["Runs"].full_name,
    tools_pb2.DESCRIPTOR.services_by_name["ToolRegistry"].full_name,
    approvals_pb2.DESCRIPTOR.services_by_name["Approvals"].full_name,
    budgets_pb2.DESCRIPTOR.services_by_name["Budgets"].full_name,
    checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"].full_name,
)


class ErrorsAndDeadlines(grpc.aio.ServerInterceptor):
    """Gives a deadline to calls that bring none, and turns domain errors into statuses.

    The one place where LedgerError meets gRPC: the error table in ``status.py`` decides the
    code and details; anything unmapped becomes INTERNAL with a generic message and a log.
    """

    def __init__(self, default_deadline_seconds: float) -> None:
        self.default_deadline_seconds = default_deadline_seconds

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if round_trips.enabled and handler is not None:
            # This call's task (unary or streaming) runs its handler after this returns.
            round_trips.begin_call(handler_call_details.method)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = handler_call_details.method
        default_deadline = self.default_deadline_seconds

        method_name = method.rsplit("/", 1)[-1]

        async def guarded(request, context):
            faults.current_method.set(method_name)
            try:
                if context.time_remaining() is not None:
                    response = await inner(request, context)  # gRPC enforces the caller's deadline
                else:
                    try:
                        response = await asyncio.wait_for(inner(request, context), default_deadline)
                    except TimeoutError:
                        raise DeadlineExceeded(f"no answer within the default {default_deadline} s") from None
                faults.crash_point("after_commit")
                return response
            except LedgerError as error:
                await context.abort_with_status(status.to_status(error))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - unmapped: INTERNAL, logged
                if isinstance(error, grpc.aio.AbortError):
                    raise
                log.exception("unhandled error in %s", method)
                await context.abort_with_status(status.internal_status())

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    database: Database
    policy: PolicyEngine
    health: health.aio.HealthServicer
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def stop(self, grace_seconds: float) -> None:
        await self.health.enter_graceful_shutdown()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.server.stop(grace_seconds)
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


async def _lease_sweeper(database: Database, interval: float, batch: int) -> None:
    """Record lease expiries by the database clock, so UNKNOWN shows up without a caller."""
    while True:
        await asyncio.sleep(interval)
        try:
            async def find(unit):
                return await repo.expired_lease_effects(unit.connection, await database_now(unit.connection), batch)

            for tenant_id, effect_id in await database.run(find):
                await database.run(lambda unit, t=tenant_id, e=effect_id: sweep_expired_leases(unit, t, e))
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


async def start_server(
    settings: ServerSettings,
    database: Database,
    policy: PolicyEngine,
    *,
    reuse_port: bool = False,
    sweep_leases: bool = True,
) -> RunningServer:
    """Serve on ``settings.listen``. ``reuse_port``: share the port with sibling worker processes
    (SO_REUSEPORT; off for a lone server, so a second server on a taken port fails to start).
    ``sweep_leases``: run the lease sweeper and the statistics keeper here (one worker per host
    does, see workers.py)."""
    limits = settings.limits
    server = grpc.aio.server(
        interceptors=[ErrorsAndDeadlines(settings.default_deadline_seconds)],
        maximum_concurrent_rpcs=settings.maximum_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", limits.message_size_max_bytes),
            ("grpc.max_send_message_length", limits.message_size_max_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    approval_settings = ApprovalSettings(
        ttl_seconds_default=settings.approval_ttl_seconds_default,
        ttl_seconds_max=settings.approval_ttl_seconds_max,
        arguments_size_max_bytes=limits.arguments_size_max_bytes,
    )
    app = Application(database, Gate(policy, limits, approval_settings, settings.reconcile_grace_seconds), limits)
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
    gate_pb2_grpc.add_GateServicer_to_server(GateServicer(app), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {settings.listen}")
    await server.start()
    running = RunningServer(server, port, database, policy, health_servicer)
    running.tasks.append(asyncio.create_task(approvals_servicer.feed.run()))  # wakes WatchApprovals streams
    running.tasks.append(
        asyncio.create_task(_health_monitor(database, health_servicer, settings.health_check_interval_seconds))
    )
    if sweep_leases:
        running.tasks.append(
            asyncio.create_task(
                _lease_sweeper(database, settings.lease_sweep_interval_seconds, limits.lease_sweep_batch_max)
            )
        )
        running.tasks.append(
            asyncio.create_task(_statistics_keeper(database, settings.statistics_interval_seconds))
        )
    host = settings.listen.rsplit(":", 1)[0]
    log.info("effect-ledger serving on %s:%d", host, port)
    if settings.port_file:
        Path(settings.port_file).write_text(f"{port}\n")
    return running


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
