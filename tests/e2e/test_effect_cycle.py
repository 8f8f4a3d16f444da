"""The full effect cycle over real gRPC, on both backends."""

from __future__ import annotations

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import authorize_request, contract, new_run, outcome_name, stage_name, succeeded


def test_authorize_dispatch_succeed_then_duplicate(server, tenant):
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)

    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    assert outcome_name(first) == "ALLOW"
    assert first.attempt_id and first.provider_idempotency_key and first.lease_expires_at.seconds > 0
    assert len(first.intent_digest) == 64 and first.policy_revision

    dispatched = agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    assert stage_name(dispatched.attempt.stage) == "DISPATCHED" and dispatched.changed

    done = agent.gate.RecordOutcome(succeeded(first.attempt_id, "msg-42"))
    assert stage_name(done.effect_stage) == "SUCCEEDED"

    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    assert outcome_name(again) == "DUPLICATE"
    assert again.effect_id == first.effect_id and not again.attempt_id
    assert again.receipt.provider_reference == "msg-42" and len(again.receipt.digest) == 64

    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id))
    assert [stage_name(a.stage) for a in effect.attempts] == ["SUCCEEDED"]

    events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
    assert [e.type for e in events] == ["run.created", "effect.authorized", "attempt.dispatched", "attempt.succeeded"]
    assert [e.revision for e in events] == [1, 2, 3, 4]
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(events, events[1:], strict=False))
    assert (
        outcome_name(agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=again.decision_id))) == "DUPLICATE"
    )
    assert (
        common_pb2.Outcome.Name(
            agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=first.decision_id)).outcome
        )
        == "ALLOW"
    )
