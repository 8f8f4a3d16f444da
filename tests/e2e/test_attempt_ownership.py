"""Attempts belong to the principal that was allowed them, over gRPC, on both backends.

A second agent of the same tenant cannot dispatch, renew, report, release or reconcile the
first agent's attempt: each call answers PERMISSION_DENIED ``ATTEMPT_NOT_OWNED`` and changes
nothing (the attempt, the effect and the run's trace stay as they were). The owner, an operator
and an admin may act on it.
"""

from __future__ import annotations

import pytest

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import (
    authorize_request,
    contract,
    failed,
    new_run,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)


@pytest.fixture
def actors(server, tenant):
    tenant.add("agent-2", "agent")
    tenant.add("operator", "operator")
    clients = {name: tenant.client(server, name) for name in ("admin", "agent", "agent-2", "operator")}
    clients["admin"].tools.PutToolContract(contract(lease_seconds=3600))
    yield clients
    for client in clients.values():
        client.close()


def _snapshot(client, effect_id: str, run_id: str):
    effect = client.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
    run = client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    return (
        stage_name(effect.stage),
        [(a.attempt_id, stage_name(a.stage), a.lease_expires_at.seconds) for a in effect.attempts],
        run.revision,
    )


def _allowed(agent, run_id: str, key: str):
    answer = agent.gate.AuthorizeEffect(authorize_request(run_id, key))
    assert common_pb2.Outcome.Name(answer.outcome) == "ALLOW"
    return answer


CALLS = {
    "dispatch": lambda gate, attempt_id, effect_id: gate.RecordDispatch(
        gate_pb2.RecordDispatchRequest(attempt_id=attempt_id)
    ),
    "renew": lambda gate, attempt_id, effect_id: gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=attempt_id)),
    "failed": lambda gate, attempt_id, effect_id: gate.RecordOutcome(failed(attempt_id)),
    "succeeded": lambda gate, attempt_id, effect_id: gate.RecordOutcome(succeeded(attempt_id)),
    "unknown": lambda gate, attempt_id, effect_id: gate.RecordOutcome(unknown(attempt_id)),
    "release": lambda gate, attempt_id, effect_id: gate.ReleaseAttempt(
        gate_pb2.ReleaseAttemptRequest(attempt_id=attempt_id, reason="not mine")
    ),
    "reconcile_not_happened": lambda gate, attempt_id, effect_id: gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=effect_id, not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="x")
        )
    ),
    "reconcile_receipt": lambda gate, attempt_id, effect_id: gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=effect_id, receipt=common_pb2.Receipt(provider_reference="forged", detail_json=b"{}")
        )
    ),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("dispatched", [False, True], ids=["authorized", "dispatched"])
def test_another_agent_cannot_act_on_an_attempt(actors, call, dispatched):
    owner, other = actors["agent"], actors["agent-2"]
    run_id = new_run(owner)
    allowed = _allowed(owner, run_id, f"k-{call}")
    if dispatched:
        owner.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    before = _snapshot(owner, allowed.effect_id, run_id)
    with raises_error("PERMISSION_DENIED", "ATTEMPT_NOT_OWNED"):
        CALLS[call](other.gate, allowed.attempt_id, allowed.effect_id)
    assert _snapshot(owner, allowed.effect_id, run_id) == before
    # The real sender's report still lands.
    done = owner.gate.RecordOutcome(succeeded(allowed.attempt_id, "msg-1"))
    assert stage_name(done.effect_stage) == "SUCCEEDED"


def test_the_owner_reports_its_own_attempt(actors):
    owner = actors["agent"]
    run_id = new_run(owner)
    allowed = _allowed(owner, run_id, "k-own")
    owner.gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=allowed.attempt_id))
    owner.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    owner.gate.RecordOutcome(unknown(allowed.attempt_id))
    effect = owner.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=allowed.effect_id, receipt=common_pb2.Receipt(provider_reference="msg-2", detail_json=b"{}")
        )
    )
    assert stage_name(effect.stage) == "SUCCEEDED"


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_a_reconciling_role_acts_on_any_attempt(actors, role):
    owner, reconciler = actors["agent"], actors[role]
    run_id = new_run(owner)
    released = _allowed(owner, run_id, f"k-release-{role}")
    answer = reconciler.gate.ReleaseAttempt(
        gate_pb2.ReleaseAttemptRequest(attempt_id=released.attempt_id, reason="stuck runtime")
    )
    assert stage_name(answer.attempt.stage) == "RELEASED"
    settled = _allowed(owner, run_id, f"k-settle-{role}")
    owner.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=settled.attempt_id))
    owner.gate.RecordOutcome(unknown(settled.attempt_id))
    effect = reconciler.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=settled.effect_id, receipt=common_pb2.Receipt(provider_reference="msg-3", detail_json=b"{}")
        )
    )
    assert stage_name(effect.stage) == "SUCCEEDED" and effect.reconciled_by == role


def test_roles_without_attempt_authority_cannot_act(actors, tenant, server):
    owner = actors["agent"]
    run_id = new_run(owner)
    allowed = _allowed(owner, run_id, "k-roles")
    for principal in ("reviewer", "auditor"):
        client = tenant.client(server, principal)
        try:
            with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
                client.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=allowed.attempt_id, reason="x"))
        finally:
            client.close()
