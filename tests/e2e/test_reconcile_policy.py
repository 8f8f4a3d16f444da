"""Settling an effect is a gated decision: ReconcileEffect is evaluated by policy
(``data.effectledger.reconcile.decision``) and recorded as a decision, like AuthorizeEffect.

Over gRPC, on both backends. The service's own refusals reach policy as
``input.ledger.refusals``; policy can refuse more, never less; a refusal commits its decision
and nothing else; a policy with no reconcile rule fails closed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import (
    REPO,
    ServerProcess,
    authorize_request,
    contract,
    new_run,
    new_tenant,
    not_happened,
    outcome_name,
    raises_error,
    stage_name,
    unknown,
)

MANUAL = "payment.manual"


def _policy_dir(extra: dict[str, str], *, without_reconcile: bool = False) -> str:
    folder = Path(tempfile.mkdtemp(prefix="el-policy-")) / "policy"
    shutil.copytree(REPO / "policy", folder)
    if without_reconcile:
        shutil.rmtree(folder / "effectledger" / "reconcile")
    for name, text in extra.items():
        (folder / name).write_text(text)
    return str(folder)


STRICTER = """package effectledger.reconcile

import rego.v1

# This deployment wants an admin for every "not happened".
deny contains reason("ADMIN_REQUIRED_TO_REOPEN", "only an admin may settle an effect as not happened here") if {
	input.evidence.kind == "not_happened"
	not "admin" in input.principal.roles
}
"""


def _uncertain(tenant, server, key: str):
    """An effect its agent sent and lost track of (UNKNOWN, by its own report), on a MANUAL_ONLY tool."""
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    admin.tools.PutToolContract(
        contract(
            MANUAL,
            effect_class=common_pb2.COMPENSATABLE,
            provider_idempotency=False,
            allowed_recovery=(common_pb2.MANUAL_ONLY,),
            max_attempts=3,
        )
    )
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, key, tool=MANUAL, target="bank:1"))
    assert outcome_name(allowed) == "ALLOW"
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))
    return agent, run_id, allowed


def _decision(client, decision_id: str):
    return client.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id))


def _events(client, run_id: str, event_type: str) -> list[dict]:
    events = client.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id, page_size=1000)).events
    return [json.loads(e.payload_json) for e in events if e.type == event_type]


def test_a_settlement_is_recorded_as_an_allowed_decision(server, tenant, operator):
    agent, run_id, allowed = _uncertain(tenant, server, "k-settled")
    settled = operator.gate.ReconcileEffect(not_happened(allowed.effect_id, "the bank has no such transfer"))
    assert stage_name(settled.stage) == "FAILED"
    (event,) = _events(agent, run_id, "effect.reconciled")
    decision = _decision(operator, event["decision_id"])
    assert outcome_name(decision) == "ALLOW" and decision.effect_id == allowed.effect_id
    assert decision.principal_id == "operator" and decision.tool == MANUAL and decision.engine == "embedded-regorus"
    policy_input = json.loads(decision.input_json)
    assert policy_input["evidence"]["kind"] == "not_happened" and policy_input["evidence"]["by_owner"] is False
    assert policy_input["ledger"]["refusals"] == []
    assert [a["principal_id"] for a in policy_input["attempts"]] == ["agent"]
    assert policy_input["contract"]["allowed_recovery"] == ["MANUAL_ONLY"]


def test_a_refusal_writes_its_decision_and_nothing_else(server, tenant):
    agent, run_id, allowed = _uncertain(tenant, server, "k-refused")
    before = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    with raises_error("PERMISSION_DENIED", "RECONCILE_NEEDS_OPERATOR"):
        agent.gate.ReconcileEffect(not_happened(allowed.effect_id, "x"))
    decision = _decision(agent, raises_error.last.metadata["decision_id"])
    assert outcome_name(decision) == "DENY"
    assert [r.code for r in decision.reasons] == ["RECONCILE_NEEDS_OPERATOR"]
    policy_input = json.loads(decision.input_json)
    assert policy_input["evidence"]["by_owner"] is True
    assert [r["code"] for r in policy_input["ledger"]["refusals"]] == ["RECONCILE_NEEDS_OPERATOR"]
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision == before
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert stage_name(effect.stage) == "UNKNOWN" and not effect.reconciled_by


@pytest.fixture(scope="module")
def stricter_server(database_url):
    running = ServerProcess(database_url, ["--policy-dir", _policy_dir({"stricter.rego": STRICTER})]).start()
    yield running
    running.stop()


def test_policy_can_refuse_what_the_service_allows(stricter_server, database_url):
    tenant = new_tenant(database_url)
    tenant.add("operator", "operator")
    agent, run_id, allowed = _uncertain(tenant, stricter_server, "k-stricter")
    operator, admin = tenant.client(stricter_server, "operator"), tenant.client(stricter_server, "admin")
    with raises_error("PERMISSION_DENIED", "ADMIN_REQUIRED_TO_REOPEN"):
        operator.gate.ReconcileEffect(not_happened(allowed.effect_id, "the bank has no such transfer"))
    refused = _decision(operator, raises_error.last.metadata["decision_id"])
    assert outcome_name(refused) == "DENY" and [r.code for r in refused.reasons] == ["ADMIN_REQUIRED_TO_REOPEN"]
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert stage_name(effect.stage) == "UNKNOWN"
    # A receipt is not what this policy restricts, and an admin may reopen.
    settled = admin.gate.ReconcileEffect(not_happened(allowed.effect_id, "the bank has no such transfer"))
    assert stage_name(settled.stage) == "FAILED" and settled.reconciled_by == "admin"


def test_a_policy_without_a_reconcile_rule_fails_closed(database_url):
    server = ServerProcess(database_url, ["--policy-dir", _policy_dir({}, without_reconcile=True)]).start()
    try:
        tenant = new_tenant(database_url)
        tenant.add("operator", "operator")
        agent, run_id, allowed = _uncertain(tenant, server, "k-undefined")
        operator = tenant.client(server, "operator")
        before = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
        with raises_error("UNAVAILABLE", "POLICY_UNDEFINED"):
            operator.gate.ReconcileEffect(not_happened(allowed.effect_id, "the bank has no such transfer"))
        assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision == before
        effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
        assert stage_name(effect.stage) == "UNKNOWN"
    finally:
        server.stop()
