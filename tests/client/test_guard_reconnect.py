"""The guard's approval wait survives its server going away: a server killed (SIGKILL) and
started again on the same database and port while the guard waits on WatchApprovals. The stream
fails with UNAVAILABLE; the guard watches again from its last sequence after a short backoff and
sees the decision a reviewer makes on the restarted server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from effect_ledger_client import AsyncLedger, Ledger
from effect_ledger_client.proto import approvals_pb2, runs_pb2
from support import ServerProcess, new_tenant

from .conftest import IRREVERSIBLE_TOOL, register_irreversible

PENDING_TIMEOUT_SECONDS = 30


@pytest.fixture
def restartable(sqlite_url):
    """A server of this test's own (it is killed and started again), and a tenant."""
    running = ServerProcess(sqlite_url).start()
    tenant = new_tenant(sqlite_url)
    with Ledger(running.target, tenant.tokens["admin"]) as admin:
        register_irreversible(admin)
    yield running, tenant
    running.stop()


def pending_approval(server: ServerProcess, token: str, run_id: str) -> str:
    """The run's pending approval request, once the guard has made it."""
    deadline = time.monotonic() + PENDING_TIMEOUT_SECONDS
    with Ledger(server.target, token) as reviewer:
        while time.monotonic() < deadline:
            pending = reviewer.approvals.ListApprovals(
                approvals_pb2.ListApprovalsRequest(run_id=run_id, state=approvals_pb2.PENDING)
            ).approvals
            if pending:
                return pending[0].approval_id
            time.sleep(0.05)
    raise AssertionError("the guard never asked for an approval")


def restart_then_approve(server: ServerProcess, token: str, run_id: str) -> str:
    approval_id = pending_approval(server, token, run_id)
    time.sleep(0.5)  # the guard is now watching the stream
    port = server.port
    server.restart()  # SIGKILL: the stream breaks; then the same database, the same port
    assert server.port == port
    # A channel of its own: channels in one process share connections, and the guard's is in
    # gRPC's reconnect backoff (which would fail this call, not retried, at once).
    with Ledger(server.target, token, options=[("grpc.use_local_subchannel_pool", 1)]) as reviewer:
        reviewer.approvals.DecideApproval(
            approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="after a restart")
        )
    return approval_id


def test_the_sync_guard_watches_again_after_the_server_restarts(restartable):
    server, tenant = restartable
    with Ledger(server.target, tenant.tokens["agent"]) as agent:
        run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        decided: list[str] = []
        reviewer = threading.Thread(
            target=lambda: decided.append(restart_then_approve(server, tenant.tokens["reviewer"], run_id)),
            daemon=True,
        )
        reviewer.start()
        with agent.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 1}, key="w1", approval_timeout_seconds=60) as effect:
            receipt = effect.succeeded("wire-1")
        reviewer.join(PENDING_TIMEOUT_SECONDS)
    assert decided and effect.response.approval_id == decided[0] and receipt.reference == "wire-1"


async def test_the_async_guard_watches_again_after_the_server_restarts(restartable):
    server, tenant = restartable
    agent = AsyncLedger(server.target, tenant.tokens["agent"])
    try:
        run_id = (await agent.runs.CreateRun(runs_pb2.CreateRunRequest())).run_id
        reviewing = asyncio.get_running_loop().run_in_executor(
            None, restart_then_approve, server, tenant.tokens["reviewer"], run_id
        )
        guard = agent.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 1}, key="w1", approval_timeout_seconds=60)
        async with guard as effect:
            receipt = await effect.succeeded("wire-1")
        approval_id = await reviewing
    finally:
        await agent.close()
    assert effect.response.approval_id == approval_id and receipt.reference == "wire-1"
