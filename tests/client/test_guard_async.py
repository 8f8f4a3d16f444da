"""``AsyncLedger.guard`` and ``AsyncLedger.guarded`` (grpc.aio) against a real server, on both
backends: the main paths of the sync guard, the lease renewed by a task."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from effect_ledger_client import (
    AlreadySucceeded,
    ApprovalTimeout,
    AsyncLedger,
    Denied,
    ReconcileRequired,
    Rejected,
)
from effect_ledger_client.proto import approvals_pb2, common_pb2, gate_pb2, runs_pb2

from .conftest import IRREVERSIBLE_TOOL, register, register_irreversible

ARGUMENTS = {"to": "bob@example.com"}


@pytest_asyncio.fixture(loop_scope="function")
async def aio(server, tenant):
    ledger = AsyncLedger(server.target, tenant.tokens["agent"])
    yield ledger
    await ledger.close()


@pytest_asyncio.fixture(loop_scope="function")
async def aio_reviewer(server, tenant):
    ledger = AsyncLedger(server.target, tenant.tokens["reviewer"])
    yield ledger
    await ledger.close()


async def new_run(aio) -> str:
    return (await aio.runs.CreateRun(runs_pb2.CreateRunRequest())).run_id


async def stage(aio, effect_id: str) -> str:
    effect = await aio.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
    return common_pb2.Stage.Name(effect.stage)


async def test_allow_runs_the_body_and_records_success(aio, admin_ledger):
    register(admin_ledger)
    run_id = await new_run(aio)
    async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        assert await stage(aio, effect.effect_id) == "DISPATCHED"
        receipt = await effect.succeeded("msg-1", detail={"status": "queued"})
    assert await stage(aio, effect.effect_id) == "SUCCEEDED" and receipt.reference == "msg-1"
    with pytest.raises(AlreadySucceeded) as done:
        async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1"):
            pytest.fail("the body of a DUPLICATE ran")
    assert done.value.receipt == receipt


async def test_deny_and_reconcile_required(aio, admin_ledger):
    run_id = await new_run(aio)
    with pytest.raises(Denied):
        async with aio.guard(run_id, "never.registered", ARGUMENTS, key="k0"):
            pytest.fail("a denied body ran")
    register(admin_ledger)
    with pytest.raises(asyncio.TimeoutError):
        async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
            raise TimeoutError()
    assert await stage(aio, effect.effect_id) == "UNKNOWN"
    with pytest.raises(ReconcileRequired) as required:
        async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1"):
            pytest.fail("the body ran while an earlier attempt is unknown")
    assert required.value.stage == "UNKNOWN"


async def test_rejected_is_failed_and_silence_is_unknown(aio, admin_ledger):
    register(admin_ledger)
    run_id = await new_run(aio)
    with pytest.raises(Rejected):
        async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1") as rejected:
            raise Rejected("no such mailbox")
    async with aio.guard(run_id, "email.send", ARGUMENTS, key="k2") as silent:
        pass
    assert await stage(aio, rejected.effect_id) == "FAILED"
    assert await stage(aio, silent.effect_id) == "UNKNOWN"


async def test_a_cancelled_body_leaves_the_effect_unknown(aio, admin_ledger):
    register(admin_ledger)
    run_id = await new_run(aio)
    started = asyncio.Event()
    holder = {}

    async def guarded_call():
        async with aio.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
            holder["effect"] = effect
            started.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(guarded_call())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await stage(aio, holder["effect"].effect_id) == "UNKNOWN"


async def test_the_decorator_returns_the_stored_receipt_on_duplicate(aio, admin_ledger):
    register(admin_ledger)
    run_id = await new_run(aio)
    calls = []

    @aio.guarded("email.send", run_id=run_id, key=lambda call: f"welcome/{call['to']}")
    async def send_welcome(to: str, *, effect):
        calls.append(to)
        return await effect.succeeded(f"msg-{len(calls)}")

    first = await send_welcome("bob@example.com")
    again = await send_welcome("bob@example.com")
    assert calls == ["bob@example.com"] and again == first
    with pytest.raises(TypeError):
        aio.guarded("email.send", run_id=run_id, key="k")(lambda effect: None)


async def test_require_approval_then_a_reviewer_approves(aio, aio_reviewer, admin_ledger):
    register_irreversible(admin_ledger)
    run_id = await new_run(aio)

    async def review():
        while True:
            pending = (
                await aio_reviewer.approvals.ListApprovals(
                    approvals_pb2.ListApprovalsRequest(run_id=run_id, state=approvals_pb2.PENDING)
                )
            ).approvals
            if pending:
                await asyncio.sleep(0.5)
                await aio_reviewer.approvals.DecideApproval(
                    approvals_pb2.DecideApprovalRequest(approval_id=pending[0].approval_id, approve=True, comment="ok")
                )
                return pending[0].approval_id
            await asyncio.sleep(0.1)

    reviewer = asyncio.create_task(review())
    async with aio.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 5}, key="w1", approval_timeout_seconds=60) as effect:
        await effect.succeeded("wire-1")
    assert effect.response.approval_id == await asyncio.wait_for(reviewer, 5)
    assert await stage(aio, effect.effect_id) == "SUCCEEDED"


async def test_approval_timeout(aio, admin_ledger):
    register_irreversible(admin_ledger)
    run_id = await new_run(aio)
    with pytest.raises(ApprovalTimeout):
        async with aio.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 5}, key="w1", approval_timeout_seconds=1):
            pytest.fail("the body ran without an approval")


async def test_the_lease_is_renewed_by_a_task(aio, admin_ledger):
    register(admin_ledger, lease_seconds=2)
    run_id = await new_run(aio)
    async with aio.guard(run_id, "email.send", ARGUMENTS, key="slow") as effect:
        first_lease_end = effect.lease_expires_at
        await asyncio.sleep(5)
        assert await stage(aio, effect.effect_id) == "DISPATCHED"
        await effect.succeeded("msg-slow")
    assert effect.lease_expires_at > first_lease_end and effect.lease_lost is None
    assert await stage(aio, effect.effect_id) == "SUCCEEDED"
    assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("effect-ledger-lease-")]
