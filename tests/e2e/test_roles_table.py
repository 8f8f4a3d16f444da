"""The roles table in docs/decisions.md ("Who may act on an attempt") against the real server.

For every RPC and role in the table, a principal holding only that role calls the RPC over
gRPC, on both backends: "no" must answer PERMISSION_DENIED ``ROLE_REQUIRED``; "yes" must get
past the role check (any other answer: the conditions in the table are tested elsewhere).
"""

from __future__ import annotations

import itertools

import pytest

from effect_ledger.errors import LedgerError
from effectledger.v1 import (
    approvals_pb2,
    budgets_pb2,
    common_pb2,
    gate_pb2,
    retention_pb2,
    runs_pb2,
    schedules_pb2,
)
from support import REPO, authorize_request, contract, new_run, unknown

ROLES = ("agent", "operator", "admin", "reviewer", "auditor")


def _table() -> dict[str, dict[str, bool]]:
    text = (REPO / "docs" / "decisions.md").read_text()
    block = text.split("<!-- roles-table -->", 1)[1].split("<!-- /roles-table -->", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in block.strip().splitlines()]
    header = [cell.strip() for cell in rows[0]]
    assert header[1:6] == list(ROLES), header
    table = {}
    for cells in rows[2:]:
        cells = [cell.strip() for cell in cells]
        assert all(cell in ("yes", "no") for cell in cells[1:6]), cells
        table[cells[0]] = {role: cell == "yes" for role, cell in zip(ROLES, cells[1:6], strict=True)}
    return table


TABLE = _table()
_keys = itertools.count()


@pytest.fixture
def setup(server, tenant):
    tenant.add("operator", "operator")
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    admin.tools.PutToolContract(contract(lease_seconds=3600))
    admin.tools.PutToolContract(
        contract("payment.wire", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
    )
    run_id = new_run(agent)
    yield admin, agent, run_id
    admin.close()
    agent.close()


def _call(rpc: str, client, agent, run_id: str) -> None:
    """One call of ``rpc`` by ``client``, on things the agent made for it."""
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, f"roles-{next(_keys)}"))
    attempt_id, effect_id = allowed.attempt_id, allowed.effect_id
    gate = client.gate
    if rpc == "AuthorizeEffect":
        gate.AuthorizeEffect(authorize_request(run_id, f"roles-{next(_keys)}"))
    elif rpc == "RecordDispatch":
        gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=attempt_id))
    elif rpc == "RenewLease":
        gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=attempt_id))
    elif rpc == "RecordOutcome":
        gate.RecordOutcome(unknown(attempt_id))
    elif rpc == "ReleaseAttempt":
        gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=attempt_id, reason="roles table"))
    elif rpc == "ReconcileEffect":
        gate.ReconcileEffect(
            gate_pb2.ReconcileEffectRequest(
                effect_id=effect_id, receipt=common_pb2.Receipt(provider_reference="r", detail_json=b"{}")
            )
        )
    elif rpc == "GetEffect":
        gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
    elif rpc == "ListOpenEffects":
        gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id))
    elif rpc == "ListEffects":
        gate.ListEffects(gate_pb2.ListEffectsRequest(run_id=run_id))
    elif rpc == "ListDecisions":
        gate.ListDecisions(gate_pb2.ListDecisionsRequest(run_id=run_id))
    elif rpc == "ListRuns":
        client.runs.ListRuns(runs_pb2.ListRunsRequest())
    elif rpc == "ListBudgets":
        client.budgets.ListBudgets(budgets_pb2.ListBudgetsRequest())
    elif rpc == "ReplayDecision":
        gate.ReplayDecision(gate_pb2.ReplayDecisionRequest(decision_id=allowed.decision_id))
    elif rpc == "DecideApproval":
        approval = agent.approvals.RequestApproval(
            approvals_pb2.RequestApprovalRequest(
                run_id=run_id,
                tool="payment.wire",
                arguments_json=b'{"n":%d}' % next(_keys),
                target="bank:1",
                reason="roles table",
            )
        )
        client.approvals.DecideApproval(
            approvals_pb2.DecideApprovalRequest(approval_id=approval.approval_id, approve=True, comment="ok")
        )
    elif rpc == "PutRetentionRule":
        client.retention.PutRetentionRule(
            retention_pb2.PutRetentionRuleRequest(kind=retention_pb2.SNAPSHOTS, max_age_seconds=0)
        )
    elif rpc == "ListRetentionRules":
        client.retention.ListRetentionRules(retention_pb2.ListRetentionRulesRequest())
    elif rpc == "PlaceLegalHold":
        client.retention.PlaceLegalHold(retention_pb2.PlaceLegalHoldRequest(run_id=run_id, reason="roles table"))
    elif rpc == "ReleaseLegalHold":
        client.retention.ReleaseLegalHold(retention_pb2.ReleaseLegalHoldRequest(run_id=run_id))
    elif rpc == "ListLegalHolds":
        client.retention.ListLegalHolds(retention_pb2.ListLegalHoldsRequest())
    elif rpc == "CollectRetention":
        client.retention.CollectRetention(retention_pb2.CollectRetentionRequest(dry_run=True))
    elif rpc == "ScheduleIntent":
        client.schedules.ScheduleIntent(_schedule_request(run_id))
    elif rpc == "ListSchedules":
        client.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(run_id=run_id))
    elif rpc == "CancelSchedule":
        made = agent.schedules.ScheduleIntent(_schedule_request(run_id))
        client.schedules.CancelSchedule(
            schedules_pb2.CancelScheduleRequest(schedule_id=made.schedule_id, reason="roles table")
        )
    else:  # pragma: no cover - a row the test does not know
        raise AssertionError(f"the roles table names an RPC this test cannot call: {rpc}")


def _schedule_request(run_id: str) -> schedules_pb2.ScheduleIntentRequest:
    return schedules_pb2.ScheduleIntentRequest(
        run_id=run_id,
        tool="email.send",
        arguments_json=b'{"n":%d}' % next(_keys),
        idempotency_key=f"roles-{next(_keys)}",
        target="mailto:bob@example.com",
        purpose=schedules_pb2.DELAYED_RETRY,
        delay_seconds=3600,
    )


@pytest.mark.parametrize("rpc", sorted(TABLE))
def test_the_roles_table_is_what_the_server_does(setup, server, tenant, rpc):
    _admin, agent, run_id = setup
    for role in ROLES:
        client = tenant.client(server, role)
        try:
            try:
                _call(rpc, client, agent, run_id)
                refused = None
            except LedgerError as error:
                refused = error.reason
            if TABLE[rpc][role]:
                assert refused != "ROLE_REQUIRED", f"{rpc} by {role}: the table says yes"
            else:
                assert refused == "ROLE_REQUIRED", f"{rpc} by {role}: the table says no, got {refused}"
        finally:
            client.close()
