"""One tenant cannot stall the others: its calls hold at most its share of a server process's
slots (``--calls-per-tenant-max``), counted from the moment its token is checked and given back
however a call ends. Against a real server on each backend, with small limits: 8 calls at once,
4 per tenant."""

from __future__ import annotations

import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from effect_ledger.client import error_from_rpc
from effectledger.v1 import approvals_pb2, approvals_pb2_grpc, common_pb2, gate_pb2_grpc, runs_pb2, runs_pb2_grpc
from support import ServerProcess, authorize_request, contract, new_run, new_tenant

CALLS_MAX = 8
CALLS_PER_TENANT_MAX = 4


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def shared_server(database_url):
    running = ServerProcess(
        database_url,
        ["--maximum-concurrent-rpcs", str(CALLS_MAX), "--calls-per-tenant-max", str(CALLS_PER_TENANT_MAX)],
    ).start()
    yield running
    running.stop()


def tenant_busy(error: grpc.RpcError) -> None:
    """``error`` is the per-tenant refusal, with the delay to retry after."""
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    refusal = error_from_rpc(error)
    assert refusal.reason == "TENANT_BUSY", refusal.reason
    assert refusal.metadata == {"calls_per_tenant_max": str(CALLS_PER_TENANT_MAX)}
    status = rpc_status.from_call(error)
    assert status is not None
    delays = []
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delays.append(retry.retry_delay.ToMilliseconds())
    assert len(delays) == 1 and delays[0] > 0, delays


def test_a_tenant_holding_slow_calls_leaves_room_for_the_others(shared_server, database_url):
    """Tenant A opens as many WatchApprovals streams as the whole process admits (each one a
    call that lasts): only its share is served, the rest are refused with TENANT_BUSY; its
    unary calls are refused too while it holds its share; tenant B's calls are served at once
    throughout. Once A's streams end (cancelled), A is served again."""
    flooding, other = new_tenant(database_url), new_tenant(database_url)
    with flooding.client(shared_server, "admin") as admin, flooding.client(shared_server, "agent") as agent:
        admin.tools.PutToolContract(
            contract("wire.send", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
        )
        admin.tools.PutToolContract(contract("email.send"))
        run_id = new_run(agent)
        agent.approvals.RequestApproval(
            approvals_pb2.RequestApprovalRequest(run_id=run_id, tool="wire.send", arguments_json=b"{}", target="a:1")
        )
    with grpc.insecure_channel(shared_server.target) as channel, other.client(shared_server, "agent") as bystander:
        stub = approvals_pb2_grpc.ApprovalsStub(channel)
        streams = []
        try:
            served, refused = 0, []
            # As many streams as the process runs calls, from two principals of tenant A.
            for index in range(CALLS_MAX):
                principal = "auditor" if index % 2 else "reviewer"
                call = stub.WatchApprovals(
                    approvals_pb2.WatchApprovalsRequest(), metadata=bearer(flooding.tokens[principal]), timeout=60
                )
                streams.append(call)
                try:
                    assert next(call).type == "approval.requested"  # served: it holds its slot
                    served += 1
                except grpc.RpcError as error:
                    refused.append(error)
            assert served == CALLS_PER_TENANT_MAX
            assert len(refused) == CALLS_MAX - CALLS_PER_TENANT_MAX
            for error in refused:
                tenant_busy(error)
            # A's unary calls, on the general path and on AuthorizeEffect's (the fast one on
            # PostgreSQL), are refused once A's token is checked.
            as_agent = bearer(flooding.tokens["agent"])
            with pytest.raises(grpc.RpcError) as unary:
                runs_pb2_grpc.RunsStub(channel).CreateRun(runs_pb2.CreateRunRequest(), metadata=as_agent, timeout=10)
            tenant_busy(unary.value)
            with pytest.raises(grpc.RpcError) as authorize:
                gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
                    authorize_request(run_id, "k-1"), metadata=as_agent, timeout=10
                )
            tenant_busy(authorize.value)
            # Tenant B is served, promptly, over and over.
            bystander_run = new_run(bystander)
            for _ in range(CALLS_MAX * 2):
                started = time.monotonic()
                assert bystander.runs.GetRun(runs_pb2.GetRunRequest(run_id=bystander_run)).run_id == bystander_run
                assert time.monotonic() - started < 5
        finally:
            for call in streams:
                call.cancel()
    # A's cancelled streams gave their slots back: all four of its calls run at once again.
    with grpc.insecure_channel(shared_server.target) as channel:
        stub = approvals_pb2_grpc.ApprovalsStub(channel)
        deadline = time.monotonic() + 10
        while True:
            calls = [
                stub.WatchApprovals(
                    approvals_pb2.WatchApprovalsRequest(), metadata=bearer(flooding.tokens["auditor"]), timeout=30
                )
                for _ in range(CALLS_PER_TENANT_MAX)
            ]
            try:
                assert all(next(call).type == "approval.requested" for call in calls)
                break
            except grpc.RpcError as error:
                tenant_busy(error)
                assert time.monotonic() < deadline, "a cancelled stream kept its tenant's slot"
                time.sleep(0.1)
            finally:
                for call in calls:
                    call.cancel()
