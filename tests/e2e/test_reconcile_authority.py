"""Settling an uncertain effect as "not happened" is not the uncertain caller's to decide.

Over gRPC, on both backends. The tool's ``allowed_recovery`` binds ReconcileEffect: for a
MANUAL_ONLY tool (or one that lists no recovery) only an operator or admin that is not the
attempt's principal may say it did not happen; for a QUERY_THEN_RETRY tool the agent may, with
the provider lookup as structured evidence, which the trace keeps. A receipt is always accepted
from the attempt's principal. A refusal writes nothing.
"""

from __future__ import annotations

import json

import pytest

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import (
    authorize_request,
    contract,
    new_run,
    not_happened,
    outcome_name,
    raises_error,
    stage_name,
    unknown,
)

MANUAL = "payment.manual"
QUERY = "payment.query"


@pytest.fixture
def tools(admin):
    admin.tools.PutToolContract(
        contract(
            MANUAL,
            effect_class=common_pb2.COMPENSATABLE,
            provider_idempotency=False,
            allowed_recovery=(common_pb2.MANUAL_ONLY,),
            max_attempts=3,
        )
    )
    admin.tools.PutToolContract(
        contract(
            QUERY,
            effect_class=common_pb2.COMPENSATABLE,
            provider_idempotency=False,
            queryable=True,
            allowed_recovery=(common_pb2.QUERY_THEN_RETRY,),
            max_attempts=3,
        )
    )


def _uncertain(agent, tool: str, key: str):
    """An effect the agent sent and lost track of: UNKNOWN, by its own report."""
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, key, tool=tool, target="bank:1"))
    assert outcome_name(allowed) == "ALLOW"
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, key, tool=tool, target="bank:1"))
    assert outcome_name(again) == "RECONCILE_REQUIRED"
    return run_id, allowed


def _revision(client, run_id: str) -> int:
    return client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision


def test_an_agent_cannot_clear_its_own_unknown_on_a_manual_only_tool(tools, agent, operator):
    run_id, allowed = _uncertain(agent, MANUAL, "k-manual")
    before = _revision(agent, run_id)
    with raises_error("PERMISSION_DENIED", "RECONCILE_NEEDS_OPERATOR"):
        agent.gate.ReconcileEffect(not_happened(allowed.effect_id, "x"))
    with raises_error("PERMISSION_DENIED", "RECONCILE_NEEDS_OPERATOR"):
        agent.gate.ReconcileEffect(not_happened(allowed.effect_id, "x", lookup=True))
    assert _revision(agent, run_id) == before
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-manual", tool=MANUAL, target="bank:1"))
    assert outcome_name(again) == "RECONCILE_REQUIRED" and not again.attempt_id

    settled = operator.gate.ReconcileEffect(not_happened(allowed.effect_id, "the bank has no such transfer"))
    assert stage_name(settled.stage) == "FAILED" and settled.reconciled_by == "operator"
    retry = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-manual", tool=MANUAL, target="bank:1"))
    assert outcome_name(retry) == "ALLOW" and retry.attempt_number == 2


def test_an_operator_cannot_clear_an_attempt_it_owns(tools, tenant, server):
    tenant.add("agent-operator", "agent", "operator")
    both = tenant.client(server, "agent-operator")
    try:
        _, allowed = _uncertain(both, MANUAL, "k-both")
        with raises_error("PERMISSION_DENIED", "RECONCILE_NEEDS_OPERATOR"):
            both.gate.ReconcileEffect(not_happened(allowed.effect_id, "I say so"))
    finally:
        both.close()


def test_a_query_then_retry_tool_takes_the_lookup_as_evidence(tools, agent):
    run_id, allowed = _uncertain(agent, QUERY, "k-query")
    before = _revision(agent, run_id)
    with raises_error("PERMISSION_DENIED", "LOOKUP_EVIDENCE_REQUIRED"):
        agent.gate.ReconcileEffect(not_happened(allowed.effect_id, "free text is no evidence"))
    bad = not_happened(allowed.effect_id, "a lookup", lookup=True)
    bad.not_happened.lookup_result_json = b"[1, 2]"
    with raises_error("INVALID_ARGUMENT"):
        agent.gate.ReconcileEffect(bad)
    assert _revision(agent, run_id) == before

    settled = agent.gate.ReconcileEffect(not_happened(allowed.effect_id, "the provider has no record", lookup=True))
    assert stage_name(settled.stage) == "FAILED"
    events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
    reconciled = json.loads(events[-1].payload_json)
    assert events[-1].type == "effect.reconciled"
    assert reconciled["lookup"] == {"reference": f"lookup-{allowed.effect_id}", "result": {"found": False}}


@pytest.mark.parametrize("tool", [MANUAL, QUERY])
def test_a_receipt_from_the_attempts_principal_is_always_accepted(tools, agent, tool):
    _, allowed = _uncertain(agent, tool, f"k-receipt-{tool}")
    settled = agent.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=allowed.effect_id, receipt=common_pb2.Receipt(provider_reference="tx-1", detail_json=b"{}")
        )
    )
    assert stage_name(settled.stage) == "SUCCEEDED"
