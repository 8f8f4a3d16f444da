"""One single-use approval, many concurrent authorizations, three server processes: one ALLOW.

Sixteen AuthorizeEffect calls present the same approved intent (same run, tool, target and
arguments) under sixteen idempotency keys, spread round-robin over three ``effect-ledger serve``
processes that share one fresh PostgreSQL database. No lock inside a process can order calls
that arrive at different processes; only the database can. Exactly one call may be allowed, the
approval must be consumed by exactly that call's attempt, and every other call must be asked for
a new approval.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from effectledger.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    common_pb2,
    gate_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)
from support import (
    authorize_request,
    contract,
    servers_on_fresh_database,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SERVERS = 3
CALLS = 16
ROUNDS = 6
CALL_TIMEOUT_SECONDS = 30.0
TOOL = "payment.wire"
TARGET = "bank:acct-1"


@pytest.fixture(scope="module")
def cluster():
    with servers_on_fresh_database("el_apr", SERVERS) as (url, servers, tenant):
        with tenant.client(servers[0], "admin") as admin:
            admin.tools.PutToolContract(
                contract(
                    TOOL,
                    effect_class=common_pb2.IRREVERSIBLE,
                    provider_idempotency=False,
                    max_attempts=1,
                    lease_seconds=3600,
                )
            )
        yield servers, tenant


class Channels:
    """One grpc.aio channel per server process, connected before any storm."""

    def __init__(self, servers, tenant) -> None:
        self.channels = [grpc.aio.insecure_channel(server.target) for server in servers]
        self.gates = [gate_pb2_grpc.GateStub(channel) for channel in self.channels]
        self.approvals = [approvals_pb2_grpc.ApprovalsStub(channel) for channel in self.channels]
        self.runs = runs_pb2_grpc.RunsStub(self.channels[0])
        self.agent = (("authorization", f"Bearer {tenant.tokens['agent']}"),)
        self.reviewer = (("authorization", f"Bearer {tenant.tokens['reviewer']}"),)

    async def __aenter__(self) -> Channels:
        await asyncio.gather(*(channel.channel_ready() for channel in self.channels))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels))


async def authorize_all(channels: Channels, requests: list) -> list:
    """Every request fired at once, request i at server i % 3; answers (or errors) in order."""
    go = asyncio.Event()

    async def one(index: int, request):
        await go.wait()
        try:
            return await channels.gates[index % SERVERS].AuthorizeEffect(
                request, metadata=channels.agent, timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            return error

    calls = [asyncio.ensure_future(one(index, request)) for index, request in enumerate(requests)]
    await asyncio.sleep(0)
    go.set()
    return await asyncio.gather(*calls)


def describe(result) -> str:
    if isinstance(result, grpc.aio.AioRpcError):
        return f"{result.code().name}: {result.details()}"
    return f"{common_pb2.Outcome.Name(result.outcome)} {[r.code for r in result.reasons]}"


async def test_one_approval_allows_exactly_one_of_many_concurrent_authorizations(cluster):
    servers, tenant = cluster
    options = {"timeout": CALL_TIMEOUT_SECONDS}
    async with Channels(servers, tenant) as channels:
        run_id = (await channels.runs.CreateRun(runs_pb2.CreateRunRequest(), metadata=channels.agent, **options)).run_id
        for round_number in range(ROUNDS):
            arguments = json.dumps({"amount": 100 + round_number, "to": "acct-1"}).encode()
            approval = await channels.approvals[round_number % SERVERS].RequestApproval(
                approvals_pb2.RequestApprovalRequest(run_id=run_id, tool=TOOL, arguments_json=arguments, target=TARGET),
                metadata=channels.agent,
                **options,
            )
            decided = await channels.approvals[(round_number + 1) % SERVERS].DecideApproval(
                approvals_pb2.DecideApprovalRequest(approval_id=approval.approval_id, approve=True, comment="ok"),
                metadata=channels.reviewer,
                **options,
            )
            assert decided.state == approvals_pb2.APPROVED

            requests = [
                authorize_request(run_id, f"r{round_number}-k{index}", tool=TOOL, arguments=arguments, target=TARGET)
                for index in range(CALLS)
            ]
            results = await authorize_all(channels, requests)
            answers = [describe(result) for result in results]
            assert all(isinstance(result, gate_pb2.AuthorizeEffectResponse) for result in results), answers
            allowed = [result for result in results if result.outcome == common_pb2.ALLOW]
            others = [result for result in results if result.outcome != common_pb2.ALLOW]
            assert len(allowed) == 1, answers
            assert all(result.outcome == common_pb2.REQUIRE_APPROVAL for result in others), answers
            (winner,) = allowed
            assert winner.approval_id == approval.approval_id and winner.attempt_id
            assert all(
                result.approval_request_id
                and result.approval_request_id != approval.approval_id
                and not result.attempt_id
                for result in others
            ), answers
            assert len({result.intent_digest for result in results}) == 1
            # ... and all of them the same one: the open request for the intent, not one each.
            assert len({result.approval_request_id for result in others}) == 1, answers

            used = await channels.approvals[2].GetApproval(
                approvals_pb2.GetApprovalRequest(approval_id=approval.approval_id), metadata=channels.agent, **options
            )
            assert used.state == approvals_pb2.CONSUMED
            assert used.consumed_by_attempt == winner.attempt_id
            effect = await channels.gates[1].GetEffect(
                gate_pb2.GetEffectRequest(effect_id=winner.effect_id), metadata=channels.agent, **options
            )
            assert [(a.attempt_id, a.approval_id) for a in effect.attempts] == [
                (winner.attempt_id, approval.approval_id)
            ]
            for result in others:
                # No effect was created for a refused key.
                assert not result.effect_id

        pending = await channels.approvals[1].ListApprovals(
            approvals_pb2.ListApprovalsRequest(run_id=run_id, state=approvals_pb2.PENDING, page_size=500),
            metadata=channels.agent,
            **options,
        )
        assert len(pending.approvals) == ROUNDS  # one new request per intent
        assert len({approval.intent_digest for approval in pending.approvals}) == ROUNDS

        # The feed agrees: one approval.consumed per approved request, naming the winner's attempt.
        events = []
        stream = channels.approvals[0].WatchApprovals(
            approvals_pb2.WatchApprovalsRequest(run_id=run_id), metadata=channels.agent, timeout=2.0
        )
        try:
            async for event in stream:
                events.append(event)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        consumed = [event for event in events if event.type == "approval.consumed"]
        assert len(consumed) == ROUNDS
        assert len({event.approval.approval_id for event in consumed}) == ROUNDS
        sequences = [event.sequence for event in events]
        assert sequences == sorted(set(sequences))


async def test_concurrent_require_approval_creates_one_request_per_intent(cluster):
    servers, tenant = cluster
    options = {"timeout": CALL_TIMEOUT_SECONDS}
    async with Channels(servers, tenant) as channels:
        run_id = (await channels.runs.CreateRun(runs_pb2.CreateRunRequest(), metadata=channels.agent, **options)).run_id
        for round_number in range(ROUNDS):
            arguments = json.dumps({"amount": 500 + round_number}).encode()
            requests = [
                authorize_request(run_id, f"q{round_number}-k{index}", tool=TOOL, arguments=arguments, target=TARGET)
                for index in range(CALLS)
            ]
            results = await authorize_all(channels, requests)
            answers = [describe(result) for result in results]
            assert all(
                isinstance(result, gate_pb2.AuthorizeEffectResponse) and result.outcome == common_pb2.REQUIRE_APPROVAL
                for result in results
            ), answers
            assert len({result.approval_request_id for result in results}) == 1, [
                r.approval_request_id for r in results
            ]
        listed = await channels.approvals[0].ListApprovals(
            approvals_pb2.ListApprovalsRequest(run_id=run_id, page_size=500), metadata=channels.agent, **options
        )
        assert len(listed.approvals) == ROUNDS
        assert all(approval.state == approvals_pb2.PENDING for approval in listed.approvals)
