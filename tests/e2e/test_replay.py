"""ReplayDecision: a recorded decision's input under the policy loaded now, on a real server
whose policy changes under it (SIGHUP reloads the embedded policy from its folder)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from effectledger.v1 import common_pb2, gate_pb2
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
    reload_policy,
    unknown,
)

pytestmark = pytest.mark.postgres

NO_EMAIL_TO_BOB = """package effectledger.gate

import rego.v1

deny contains reason("BOB_IS_BLOCKED", "mail to bob is blocked by this deployment") if {
	input.request.target == "mailto:bob@example.com"
}
"""


@pytest.fixture
def changing(pg_url):
    folder = Path(tempfile.mkdtemp(prefix="el-policy-")) / "policy"
    shutil.copytree(REPO / "policy", folder)
    server = ServerProcess(pg_url, ["--policy-dir", str(folder)]).start()
    try:
        yield server, folder, new_tenant(pg_url)
    finally:
        server.stop()
        shutil.rmtree(folder.parent, ignore_errors=True)


def replay(client, decision_id: str) -> gate_pb2.ReplayDecisionResponse:
    return client.gate.ReplayDecision(gate_pb2.ReplayDecisionRequest(decision_id=decision_id))


def test_replay_shows_what_the_current_policy_answers_and_what_changed(changing, pg_url):
    server, folder, tenant = changing
    admin, agent, auditor = (tenant.client(server, name) for name in ("admin", "agent", "auditor"))
    admin.tools.PutToolContract(contract(lease_seconds=3600))
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    assert outcome_name(allowed) == "ALLOW"

    same = replay(auditor, allowed.decision_id)
    assert same.recorded.decision_id == allowed.decision_id and same.recorded.input_json
    assert same.outcome == common_pb2.ALLOW and same.package == "effectledger/gate"
    assert not same.outcome_changed and not same.policy_changed
    assert (list(same.reasons_added), list(same.reasons_removed)) == ([], [])
    assert same.policy_revision == same.recorded.policy_revision

    (folder / "effectledger" / "gate" / "bob.rego").write_text(NO_EMAIL_TO_BOB)
    reload_policy(server)
    decisions_before = agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest()).decisions
    changed = replay(auditor, allowed.decision_id)
    assert changed.outcome == common_pb2.DENY and changed.outcome_changed and changed.policy_changed
    assert changed.recorded.outcome == common_pb2.ALLOW
    assert changed.policy_revision != changed.recorded.policy_revision
    assert "BOB_IS_BLOCKED" in changed.reasons_added and "BOB_IS_BLOCKED" in {r.code for r in changed.reasons}
    assert list(changed.reasons_removed) == [r.code for r in changed.recorded.reasons if r.code != "BOB_IS_BLOCKED"]
    # A replay writes nothing: no decision, no trace event.
    assert agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest()).decisions == decisions_before
    # The gate itself now answers as the replay said it would.
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k-2"))) == "DENY"

    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        replay(agent, allowed.decision_id)
    with raises_error("NOT_FOUND"):
        replay(auditor, "dec_does_not_exist")
    with raises_error("INVALID_ARGUMENT"):
        replay(auditor, "")
    stranger = new_tenant(pg_url).client(server, "auditor")
    with raises_error("NOT_FOUND"):
        replay(stranger, allowed.decision_id)


def test_replay_of_a_reconcile_decision_asks_the_reconcile_policy(changing):
    server, _, tenant = changing
    tenant.add("operator", "operator")
    admin, agent, operator = (tenant.client(server, name) for name in ("admin", "agent", "operator"))
    admin.tools.PutToolContract(contract(lease_seconds=3600))
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))
    operator.gate.ReconcileEffect(not_happened(allowed.effect_id, lookup=True))
    reconciled = agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest(run_id=run_id)).decisions[-1]
    assert reconciled.decision_id != allowed.decision_id
    answer = replay(operator, reconciled.decision_id)
    assert answer.package == "effectledger/reconcile"
    assert answer.outcome == answer.recorded.outcome == common_pb2.ALLOW and not answer.outcome_changed
