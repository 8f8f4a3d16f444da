"""Every approval rule, over real gRPC, on PostgreSQL and on SQLite.

An approval is bound to one exact intent (tenant, run, tool, tool revision, intent digest), is
used up only by the ALLOW it enables, counts only while its reviewers hold a deciding role, and
stops counting when it expires, is revoked or is denied. Quorum and reuse need a policy that asks
for them: those tests run a second server on the same database with an edited copy of policy/.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import grpc
import pytest

from effect_ledger.client import error_from_rpc
from effectledger.v1 import approvals_pb2, common_pb2, gate_pb2
from support import (
    REPO,
    ServerProcess,
    authorize_request,
    contract,
    new_run,
    new_tenant,
    outcome_name,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)

WIRE = "payment.wire"
DROP = "db.drop"
QUORUM_TOOL = "payment.wire.quorum"
REUSE_TOOL = "payment.wire.reusable"
TARGET = "bank:acct-1"
ARGS_A = b'{"amount":100,"to":"acct-1"}'
ARGS_B = b'{"amount":999,"to":"acct-1"}'

PENDING = approvals_pb2.PENDING
APPROVED = approvals_pb2.APPROVED
DENIED = approvals_pb2.DENIED
REVOKED = approvals_pb2.REVOKED
CONSUMED = approvals_pb2.CONSUMED
EXPIRED = approvals_pb2.EXPIRED


# --- helpers -------------------------------------------------------------------------------


def irreversible(tool: str = WIRE, lease_seconds: int = 60):
    return contract(
        tool,
        effect_class=common_pb2.IRREVERSIBLE,
        provider_idempotency=False,
        max_attempts=1,
        lease_seconds=lease_seconds,
    )


def wire(run_id: str, key: str, *, arguments: bytes = ARGS_A, target: str = TARGET, tool: str = WIRE):
    return authorize_request(run_id, key, tool=tool, arguments=arguments, target=target)


def state_name(value: int) -> str:
    return approvals_pb2.ApprovalState.Name(value)


def codes(response) -> list[str]:
    return [reason.code for reason in response.reasons]


def get(client, approval_id: str) -> approvals_pb2.Approval:
    return client.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))


def decide(client, approval_id: str, approve: bool = True, comment: str = "looks right"):
    return client.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=approve, comment=comment)
    )


def request_approval(
    client,
    run_id: str,
    *,
    tool: str = WIRE,
    arguments: bytes = ARGS_A,
    target: str = TARGET,
    reusable: bool = False,
    ttl_seconds: int = 0,
    reason: str = "please",
) -> approvals_pb2.Approval:
    return client.approvals.RequestApproval(
        approvals_pb2.RequestApprovalRequest(
            run_id=run_id,
            tool=tool,
            arguments_json=arguments,
            target=target,
            reason=reason,
            reusable=reusable,
            ttl_seconds=ttl_seconds,
        )
    )


def revoke(client, approval_id: str, reason: str = "changed my mind"):
    return client.approvals.RevokeApproval(approvals_pb2.RevokeApprovalRequest(approval_id=approval_id, reason=reason))


def listed(client, page_size: int = 0, **filters) -> list[approvals_pb2.Approval]:
    """Every page of ListApprovals, concatenated."""
    found, token, pages = [], "", 0
    while True:
        page = client.approvals.ListApprovals(
            approvals_pb2.ListApprovalsRequest(page_size=page_size, page_token=token, **filters)
        )
        found.extend(page.approvals)
        pages += 1
        assert pages < 1000, "paging does not end"
        token = page.next_page_token
        if not token:
            return found


def ids(approvals) -> list[str]:
    return [approval.approval_id for approval in approvals]


def policy_input(client, decision_id: str) -> dict:
    decision = client.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id))
    return json.loads(decision.input_json)


def wait_until_expired(client, approval_id: str, timeout: float = 15.0) -> approvals_pb2.Approval:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = get(client, approval_id)
        if found.state == EXPIRED:
            return found
        time.sleep(0.1)
    raise AssertionError(f"approval {approval_id} did not expire in {timeout} s: {state_name(found.state)}")


def watch(
    client,
    *,
    after_sequence: int = 0,
    seconds: float = 1.5,
    run_id: str = "",
    tool: str = "",
    from_now: bool = False,
) -> list:
    """Every event the stream delivers before its deadline; the deadline is how it ends."""
    stream = client.approvals.WatchApprovals(
        approvals_pb2.WatchApprovalsRequest(after_sequence=after_sequence, run_id=run_id, tool=tool, from_now=from_now),
        timeout=seconds,
    )
    events = []
    try:
        for event in stream:
            events.append(event)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
    else:
        raise AssertionError("the stream ended before its deadline")
    return events


def assert_consecutive(events, first: int) -> None:
    sequences = [event.sequence for event in events]
    assert sequences == list(range(first, first + len(events))), sequences


# --- one request per intent ----------------------------------------------------------------


def test_require_approval_creates_one_request_per_intent(agent, admin):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(first) == "REQUIRE_APPROVAL" and codes(first) == ["IRREVERSIBLE_TOOL"]
    assert first.approval_request_id and not first.attempt_id and not first.approval_id
    again = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    other_key = agent.gate.AuthorizeEffect(wire(run_id, "k2"))
    assert outcome_name(again) == outcome_name(other_key) == "REQUIRE_APPROVAL"
    assert again.approval_request_id == other_key.approval_request_id == first.approval_request_id
    asked = request_approval(agent, run_id)
    assert asked.approval_id == first.approval_request_id

    (approval,) = listed(agent, run_id=run_id)
    assert approval.approval_id == first.approval_request_id
    assert state_name(approval.state) == "PENDING" and not approval.votes
    assert (approval.run_id, approval.tool, approval.tool_revision, approval.target) == (run_id, WIRE, 1, TARGET)
    assert approval.intent_digest == first.intent_digest
    assert json.loads(approval.arguments_json) == json.loads(ARGS_A)
    assert approval.requested_by == "agent" and approval.quorum == 1 and not approval.reusable
    assert approval.expires_at.ToDatetime() > approval.created_at.ToDatetime()
    assert get(agent, approval.approval_id) == approval


# --- binding -------------------------------------------------------------------------------


def test_an_approval_binds_the_exact_arguments_target_and_tool_revision(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    asked = agent.gate.AuthorizeEffect(wire(run_id, "k-a"))
    approval_id = asked.approval_request_id
    assert state_name(decide(reviewer, approval_id).state) == "APPROVED"

    other_arguments = agent.gate.AuthorizeEffect(wire(run_id, "k-b", arguments=ARGS_B))
    assert outcome_name(other_arguments) == "REQUIRE_APPROVAL"
    assert other_arguments.intent_digest != asked.intent_digest
    assert other_arguments.approval_request_id not in ("", approval_id)
    other_target = agent.gate.AuthorizeEffect(wire(run_id, "k-t", target="bank:acct-2"))
    assert outcome_name(other_target) == "REQUIRE_APPROVAL"
    assert other_target.approval_request_id not in ("", approval_id, other_arguments.approval_request_id)
    still = get(agent, approval_id)
    assert state_name(still.state) == "APPROVED" and not still.consumed_by_attempt

    # A new tool revision (one changed term) makes a new digest for the same arguments and target.
    revised = admin.tools.PutToolContract(irreversible(lease_seconds=120))
    assert revised.revision == 2
    for key in ("k-a", "k-r"):
        after_revision = agent.gate.AuthorizeEffect(wire(run_id, key))
        assert outcome_name(after_revision) == "REQUIRE_APPROVAL", codes(after_revision)
        assert after_revision.tool_revision == 2 and after_revision.intent_digest != asked.intent_digest
        assert after_revision.approval_request_id not in ("", approval_id)
        assert get(agent, after_revision.approval_request_id).tool_revision == 2
    still = get(agent, approval_id)
    assert state_name(still.state) == "APPROVED" and not still.consumed_by_attempt
    assert len(listed(agent, run_id=run_id)) == 4


# --- consumption ---------------------------------------------------------------------------


def test_an_approval_is_consumed_by_the_allow_it_enables_and_only_once(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    approval_id = agent.gate.AuthorizeEffect(wire(run_id, "k1")).approval_request_id
    decide(reviewer, approval_id)

    mismatched = agent.gate.AuthorizeEffect(wire(run_id, "k-other", arguments=ARGS_B))
    assert outcome_name(mismatched) == "REQUIRE_APPROVAL"
    assert state_name(get(agent, approval_id).state) == "APPROVED"

    allowed = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == approval_id and allowed.attempt_id
    used = get(agent, approval_id)
    assert state_name(used.state) == "CONSUMED" and used.consumed_by_attempt == allowed.attempt_id
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert [attempt.approval_id for attempt in effect.attempts] == [approval_id]
    decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=allowed.decision_id))
    assert decision.attempt_id == allowed.attempt_id

    second = agent.gate.AuthorizeEffect(wire(run_id, "k2"))
    assert outcome_name(second) == "REQUIRE_APPROVAL" and not second.attempt_id
    assert second.approval_request_id not in ("", approval_id)
    (seen,) = policy_input(agent, second.decision_id)["approvals"]
    assert seen["approval_id"] == approval_id and seen["state"] == "CONSUMED"
    assert "APPROVAL_USED" in seen["binding_problems"]
    used_again = get(agent, approval_id)
    assert state_name(used_again.state) == "CONSUMED" and used_again.consumed_by_attempt == allowed.attempt_id
    assert state_name(get(agent, second.approval_request_id).state) == "PENDING"
    # The first key's own effect is open: the ledger answers, and no approval is touched.
    assert outcome_name(agent.gate.AuthorizeEffect(wire(run_id, "k1"))) == "RECONCILE_REQUIRED"
    assert sorted(ids(listed(agent, run_id=run_id))) == sorted(
        [approval_id, mismatched.approval_request_id, second.approval_request_id]
    )


def test_a_denied_or_duplicate_authorization_consumes_nothing(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    # Effect X on the target ends UNKNOWN: policy denies new effects on that target.
    first_x = decide(reviewer, agent.gate.AuthorizeEffect(wire(run_id, "k-x")).approval_request_id)
    x = agent.gate.AuthorizeEffect(wire(run_id, "k-x"))
    assert outcome_name(x) == "ALLOW" and x.approval_id == first_x.approval_id
    agent.gate.RecordOutcome(unknown(x.attempt_id))

    approval_y = request_approval(agent, run_id, arguments=ARGS_B)
    decide(reviewer, approval_y.approval_id)
    denied = agent.gate.AuthorizeEffect(wire(run_id, "k-y", arguments=ARGS_B))
    assert outcome_name(denied) == "DENY" and codes(denied) == ["TARGET_HAS_UNKNOWN_EFFECT"]
    assert not denied.attempt_id and not denied.approval_request_id
    after_deny = get(agent, approval_y.approval_id)
    assert state_name(after_deny.state) == "APPROVED" and not after_deny.consumed_by_attempt

    agent.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=x.effect_id, receipt=common_pb2.Receipt(provider_reference="wire-1", detail_json=b"{}")
        )
    )
    # A fresh approval of intent X, then the succeeded key k-x again: DUPLICATE, nothing used.
    second_x = request_approval(agent, run_id)
    assert second_x.approval_id != first_x.approval_id
    decide(reviewer, second_x.approval_id)
    duplicate = agent.gate.AuthorizeEffect(wire(run_id, "k-x"))
    assert outcome_name(duplicate) == "DUPLICATE" and not duplicate.attempt_id
    assert duplicate.receipt.provider_reference == "wire-1"
    after_duplicate = get(agent, second_x.approval_id)
    assert state_name(after_duplicate.state) == "APPROVED" and not after_duplicate.consumed_by_attempt

    y = agent.gate.AuthorizeEffect(wire(run_id, "k-y", arguments=ARGS_B))
    assert outcome_name(y) == "ALLOW" and y.approval_id == approval_y.approval_id
    assert get(agent, approval_y.approval_id).consumed_by_attempt == y.attempt_id
    x2 = agent.gate.AuthorizeEffect(wire(run_id, "k-x2"))
    assert outcome_name(x2) == "ALLOW" and x2.approval_id == second_x.approval_id
    assert get(agent, second_x.approval_id).consumed_by_attempt == x2.attempt_id
    assert get(agent, first_x.approval_id).consumed_by_attempt == x.attempt_id


# --- expiry, revocation, denial ------------------------------------------------------------


def test_an_expired_approval_does_not_allow_and_cannot_be_decided(tenant, server, agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    tenant.add("reviewer2", "reviewer")
    reviewer2 = tenant.client(server, "reviewer2")
    run_id = new_run(agent)
    approved = request_approval(agent, run_id, ttl_seconds=1)
    pending = request_approval(agent, run_id, arguments=ARGS_B, ttl_seconds=1)
    assert state_name(decide(reviewer, approved.approval_id).state) == "APPROVED"

    expired = wait_until_expired(agent, approved.approval_id)
    assert expired.expires_at.ToDatetime() == approved.expires_at.ToDatetime()
    wait_until_expired(agent, pending.approval_id)
    answer = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(answer) == "REQUIRE_APPROVAL" and not answer.attempt_id
    assert answer.approval_request_id not in ("", approved.approval_id)
    (seen,) = policy_input(agent, answer.decision_id)["approvals"]
    assert seen["state"] == "EXPIRED" and "APPROVAL_EXPIRED" in seen["binding_problems"]
    assert state_name(get(agent, approved.approval_id).state) == "EXPIRED"

    for late in (approved.approval_id, pending.approval_id):
        with raises_error("FAILED_PRECONDITION", "APPROVAL_EXPIRED"):
            decide(reviewer2, late)
    with raises_error("FAILED_PRECONDITION", "APPROVAL_EXPIRED"):
        decide(reviewer, pending.approval_id, approve=False, comment="too late anyway")
    assert len(get(agent, pending.approval_id).votes) == 0
    assert sorted(ids(listed(agent, run_id=run_id, state=EXPIRED))) == sorted(
        [approved.approval_id, pending.approval_id]
    )
    reviewer2.close()


def test_a_revoked_approval_does_not_allow(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    approval_id = agent.gate.AuthorizeEffect(wire(run_id, "k1")).approval_request_id
    decide(reviewer, approval_id)
    revoked = revoke(reviewer, approval_id, "the payee changed")
    assert state_name(revoked.state) == "REVOKED"
    assert revoked.revoked_by == "reviewer" and revoked.revoke_reason == "the payee changed"

    answer = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(answer) == "REQUIRE_APPROVAL" and not answer.attempt_id
    assert answer.approval_request_id not in ("", approval_id)
    (seen,) = policy_input(agent, answer.decision_id)["approvals"]
    assert seen["state"] == "REVOKED" and "APPROVAL_REVOKED" in seen["binding_problems"]
    assert state_name(get(agent, approval_id).state) == "REVOKED"
    with raises_error("FAILED_PRECONDITION", "APPROVAL_NOT_PENDING"):
        decide(reviewer, approval_id)
    # The requester may revoke its own pending request too.
    assert state_name(revoke(agent, answer.approval_request_id, "not needed").state) == "REVOKED"
    assert outcome_name(agent.gate.AuthorizeEffect(wire(run_id, "k1"))) == "REQUIRE_APPROVAL"


def test_a_denial_is_recorded_and_denies_until_a_new_request_is_approved(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    approval_id = agent.gate.AuthorizeEffect(wire(run_id, "k1")).approval_request_id
    with raises_error("INVALID_ARGUMENT"):
        decide(reviewer, approval_id, approve=False, comment="")  # a denial says why
    denied = decide(reviewer, approval_id, approve=False, comment="amount too large")
    assert state_name(denied.state) == "DENIED"
    (vote,) = denied.votes
    assert (vote.reviewer_id, vote.approve, vote.comment) == ("reviewer", False, "amount too large")

    answer = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(answer) == "DENY" and codes(answer) == ["APPROVAL_DENIED"]
    assert approval_id in answer.reasons[0].message and "reviewer" in answer.reasons[0].message
    assert not answer.attempt_id and not answer.approval_request_id
    assert outcome_name(agent.gate.AuthorizeEffect(wire(run_id, "k2"))) == "DENY"
    with raises_error("FAILED_PRECONDITION", "APPROVAL_NOT_PENDING"):
        decide(reviewer, approval_id)

    fresh = request_approval(agent, run_id, reason="reduced risk, please look again")
    assert fresh.approval_id != approval_id and state_name(fresh.state) == "PENDING"
    assert outcome_name(agent.gate.AuthorizeEffect(wire(run_id, "k1"))) == "DENY"  # not approved yet
    decide(reviewer, fresh.approval_id)
    allowed = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == fresh.approval_id
    assert state_name(get(agent, approval_id).state) == "DENIED"


# --- authority -----------------------------------------------------------------------------


def test_who_may_decide(tenant, server, database_url, agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    tenant.add("both", "agent", "reviewer")
    both = tenant.client(server, "both")
    run_id = new_run(both)
    approval_id = both.gate.AuthorizeEffect(wire(run_id, "k1")).approval_request_id
    assert get(both, approval_id).requested_by == "both"

    with raises_error("PERMISSION_DENIED", "SELF_APPROVAL"):
        decide(both, approval_id)
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        decide(agent, approval_id)
    auditor = tenant.client(server, "auditor")
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        decide(auditor, approval_id)
    elsewhere = new_tenant(database_url)
    stranger = elsewhere.client(server, "reviewer")
    with raises_error("NOT_FOUND"):
        decide(stranger, approval_id)
    with raises_error("NOT_FOUND"):
        get(stranger, approval_id)
    with raises_error("NOT_FOUND"):
        revoke(stranger, approval_id)
    assert listed(stranger) == []
    untouched = get(both, approval_id)
    assert state_name(untouched.state) == "PENDING" and not untouched.votes
    assert outcome_name(both.gate.AuthorizeEffect(wire(run_id, "k1"))) == "REQUIRE_APPROVAL"

    approved = decide(admin, approval_id)  # an admin decides too
    assert state_name(approved.state) == "APPROVED" and [v.reviewer_id for v in approved.votes] == ["admin"]
    allowed = both.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == approval_id
    for client in (both, auditor, stranger):
        client.close()


def test_an_approval_counts_only_while_its_reviewer_holds_the_role(tenant, agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    approval_id = agent.gate.AuthorizeEffect(wire(run_id, "k1")).approval_request_id
    decide(reviewer, approval_id)
    tenant.set_roles("reviewer", "auditor")

    answer = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(answer) != "ALLOW" and not answer.attempt_id
    assert outcome_name(answer) == "REQUIRE_APPROVAL"
    seen = policy_input(agent, answer.decision_id)["approvals"]
    assert seen[0]["approval_id"] == approval_id
    assert seen[0]["valid_approvers"] == [] and "APPROVAL_QUORUM_NOT_MET" in seen[0]["binding_problems"]
    assert state_name(get(agent, approval_id).state) == "APPROVED" and not get(agent, approval_id).consumed_by_attempt
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        decide(reviewer, answer.approval_request_id)

    tenant.set_roles("reviewer", "reviewer")  # the same vote counts again, by current facts
    allowed = agent.gate.AuthorizeEffect(wire(run_id, "k1"))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == approval_id
    assert get(agent, approval_id).consumed_by_attempt == allowed.attempt_id


# --- listing -------------------------------------------------------------------------------


def test_list_approvals_filters_and_pages(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible(WIRE))
    admin.tools.PutToolContract(irreversible(DROP))
    run1, run2 = new_run(agent), new_run(agent)

    def args(n: int) -> bytes:
        return json.dumps({"amount": n}).encode()

    expired = request_approval(agent, run2, arguments=args(0), ttl_seconds=1).approval_id
    pending = [request_approval(agent, run1, arguments=args(n)).approval_id for n in range(1, 6)]
    approved = decide(reviewer, request_approval(agent, run1, arguments=args(10)).approval_id).approval_id
    denied = decide(
        reviewer, request_approval(agent, run1, tool=DROP, arguments=args(11)).approval_id, False, "no"
    ).approval_id
    revoked = revoke(reviewer, request_approval(agent, run2, arguments=args(12)).approval_id).approval_id
    consumed = decide(reviewer, request_approval(agent, run2, tool=DROP, arguments=args(13)).approval_id).approval_id
    allowed = agent.gate.AuthorizeEffect(wire(run2, "k-consume", tool=DROP, arguments=args(13)))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == consumed
    wait_until_expired(agent, expired)

    everything = listed(agent)
    assert ids(everything) == sorted([expired, *pending, approved, denied, revoked, consumed])
    by_state = {state_name(a.state): set() for a in everything}
    for approval in everything:
        by_state[state_name(approval.state)].add(approval.approval_id)
    assert by_state == {
        "PENDING": set(pending),
        "APPROVED": {approved},
        "DENIED": {denied},
        "REVOKED": {revoked},
        "CONSUMED": {consumed},
        "EXPIRED": {expired},
    }
    for state, expected in by_state.items():
        found = listed(agent, state=approvals_pb2.ApprovalState.Value(state))
        assert set(ids(found)) == expected, state
        assert all(state_name(a.state) == state for a in found)
    assert set(ids(listed(agent, run_id=run1))) == {*pending, approved, denied}
    assert set(ids(listed(agent, run_id=run2))) == {expired, revoked, consumed}
    assert set(ids(listed(agent, tool=DROP))) == {denied, consumed}
    assert set(ids(listed(agent, tool=WIRE))) == {expired, *pending, approved, revoked}
    assert ids(listed(agent, run_id=run2, tool=WIRE, state=EXPIRED)) == [expired]
    assert ids(listed(agent, run_id=run1, tool=WIRE, state=PENDING)) == pending
    assert listed(agent, run_id=run1, state=REVOKED) == []
    assert listed(agent, tool="no.such.tool") == []

    for size in (1, 2, 3, 4, 11, 12, 13):
        pages = listed(agent, page_size=size)
        assert ids(pages) == ids(everything), size
        first = agent.approvals.ListApprovals(approvals_pb2.ListApprovalsRequest(page_size=size))
        assert len(first.approvals) == min(size, len(everything))
        assert ids(listed(agent, page_size=size, run_id=run1)) == sorted([*pending, approved, denied])
        assert ids(listed(agent, page_size=size, state=PENDING)) == pending
        assert ids(listed(agent, page_size=size, state=EXPIRED)) == [expired]
        assert ids(listed(agent, page_size=size, tool=WIRE, run_id=run2)) == sorted([expired, revoked])
    with raises_error("INVALID_ARGUMENT"):
        agent.approvals.ListApprovals(approvals_pb2.ListApprovalsRequest(page_size=501))
    with raises_error("INVALID_ARGUMENT"):
        agent.approvals.ListApprovals(approvals_pb2.ListApprovalsRequest(page_token="gA=="))


# --- the event feed ------------------------------------------------------------------------


def test_watch_approvals_delivers_every_event_in_order_and_resumes(server, tenant, agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible())
    run1, run2 = new_run(agent), new_run(agent)

    a1 = agent.gate.AuthorizeEffect(wire(run1, "k1")).approval_request_id  # 1 requested
    decide(reviewer, a1)  # 2 approved
    allowed = agent.gate.AuthorizeEffect(wire(run1, "k1"))  # 3 consumed
    assert outcome_name(allowed) == "ALLOW"
    a2 = request_approval(agent, run2).approval_id  # 4 requested
    decide(reviewer, a2, approve=False, comment="no")  # 5 denied

    before = watch(agent, seconds=1.5)
    assert_consecutive(before, 1)
    assert [(e.type, e.approval.approval_id) for e in before] == [
        ("approval.requested", a1),
        ("approval.approved", a1),
        ("approval.consumed", a1),
        ("approval.requested", a2),
        ("approval.denied", a2),
    ]
    assert [e.principal_id for e in before] == ["agent", "reviewer", "agent", "agent", "reviewer"]
    assert before[2].approval.consumed_by_attempt == allowed.attempt_id
    last = before[-1].sequence

    # A watcher resumes from the cursor while the next events are being made.
    resumed: list = []
    watcher_client = tenant.client(server, "auditor")
    watcher = threading.Thread(target=lambda: resumed.extend(watch(watcher_client, after_sequence=last, seconds=4.0)))
    watcher.start()
    time.sleep(0.3)
    a3 = request_approval(agent, run1, arguments=ARGS_B).approval_id  # 6 requested
    revoke(reviewer, a3)  # 7 revoked
    a4 = agent.gate.AuthorizeEffect(wire(run2, "k4", arguments=ARGS_B)).approval_request_id  # 8 requested
    decide(reviewer, a4)  # 9 approved
    watcher.join()
    watcher_client.close()
    assert_consecutive(resumed, last + 1)
    assert [(e.type, e.approval.approval_id) for e in resumed] == [
        ("approval.requested", a3),
        ("approval.revoked", a3),
        ("approval.requested", a4),
        ("approval.approved", a4),
    ]

    everything = watch(agent, seconds=1.0)
    assert_consecutive(everything, 1)
    union = [(e.sequence, e.type, e.approval.approval_id) for e in before + resumed]
    assert union == [(e.sequence, e.type, e.approval.approval_id) for e in everything]
    assert len({sequence for sequence, _, _ in union}) == len(union) == 9
    assert watch(agent, after_sequence=everything[-1].sequence, seconds=0.5) == []

    of_run1 = watch(agent, run_id=run1, seconds=0.8)
    assert [e.sequence for e in of_run1] == [e.sequence for e in everything if e.approval.run_id == run1]
    assert [e.sequence for e in of_run1] == [1, 2, 3, 6, 7]
    assert all(e.approval.run_id == run1 for e in of_run1)
    of_run2_after = watch(agent, run_id=run2, after_sequence=5, seconds=0.8)
    assert [e.sequence for e in of_run2_after] == [8, 9]
    assert watch(agent, tool="no.such.tool", seconds=0.5) == []

    other_tenant = new_tenant(tenant.database_url)
    stranger = other_tenant.client(server, "auditor")
    assert watch(stranger, seconds=0.5) == []
    stranger.close()


def test_watch_approvals_from_now_replays_nothing_and_follows_what_comes(server, tenant, agent, admin, reviewer):
    """A watch "from now" starts after the tenant's latest event: none of the history, every
    event after it, numbered as always (so a resumed watch takes up from the last one)."""
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    first = request_approval(agent, run_id).approval_id  # 1 requested
    decide(reviewer, first)  # 2 approved
    assert watch(agent, from_now=True, seconds=0.8) == []

    following: list = []
    watcher_client = tenant.client(server, "auditor")
    watcher = threading.Thread(target=lambda: following.extend(watch(watcher_client, from_now=True, seconds=3.0)))
    watcher.start()
    time.sleep(0.5)
    second = request_approval(agent, run_id, arguments=ARGS_B).approval_id  # 3 requested
    revoke(reviewer, first)  # 4 revoked
    watcher.join()
    watcher_client.close()
    assert [(e.sequence, e.type, e.approval.approval_id) for e in following] == [
        (3, "approval.requested", second),
        (4, "approval.revoked", first),
    ]
    both = agent.approvals.WatchApprovals(
        approvals_pb2.WatchApprovalsRequest(after_sequence=2, from_now=True), timeout=5.0
    )
    with pytest.raises(grpc.RpcError) as refused:
        next(both)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error_from_rpc(refused.value).violations] == ["from_now"]


# --- quorum and reuse (an edited policy) ---------------------------------------------------


@pytest.fixture(scope="module")
def policy_server(database_url, tmp_path_factory):
    """A second server on the same database, with a policy that asks for a quorum and lets
    one tool reuse reusable approvals."""
    folder = tmp_path_factory.mktemp("policy")
    shutil.copytree(REPO / "policy", folder, dirs_exist_ok=True)
    rego = Path(folder) / "effectledger" / "gate" / "gate.rego"
    text = rego.read_text()
    for old, new in (
        ("quorums := {}\n", f'quorums := {{"{QUORUM_TOOL}": 2}}\n'),
        ("reusable_approval_tools := set()\n", f'reusable_approval_tools := {{"{REUSE_TOOL}"}}\n'),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    rego.write_text(text)
    running = ServerProcess(database_url, ["--policy-dir", str(folder)]).start()
    yield running
    running.stop()


def test_a_quorum_needs_distinct_reviewers(policy_server, tenant):
    tenant.add("reviewer2", "reviewer")
    agent, admin, reviewer, reviewer2 = (
        tenant.client(policy_server, p) for p in ("agent", "admin", "reviewer", "reviewer2")
    )
    admin.tools.PutToolContract(irreversible(QUORUM_TOOL))
    run_id = new_run(agent)
    asked = agent.gate.AuthorizeEffect(wire(run_id, "k1", tool=QUORUM_TOOL))
    assert outcome_name(asked) == "REQUIRE_APPROVAL"
    approval_id = asked.approval_request_id
    assert get(agent, approval_id).quorum == 2

    one = decide(reviewer, approval_id)
    assert state_name(one.state) == "PENDING" and [v.reviewer_id for v in one.votes] == ["reviewer"]
    still = agent.gate.AuthorizeEffect(wire(run_id, "k1", tool=QUORUM_TOOL))
    assert outcome_name(still) == "REQUIRE_APPROVAL" and still.approval_request_id == approval_id
    with raises_error("FAILED_PRECONDITION", "ALREADY_DECIDED"):
        decide(reviewer, approval_id)
    with raises_error("FAILED_PRECONDITION", "ALREADY_DECIDED"):
        decide(reviewer, approval_id, approve=False, comment="changed my mind")
    assert len(get(agent, approval_id).votes) == 1

    two = decide(reviewer2, approval_id)
    assert state_name(two.state) == "APPROVED"
    assert sorted(v.reviewer_id for v in two.votes) == ["reviewer", "reviewer2"]
    allowed = agent.gate.AuthorizeEffect(wire(run_id, "k1", tool=QUORUM_TOOL))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == approval_id
    assert get(agent, approval_id).consumed_by_attempt == allowed.attempt_id

    # A request made through the API starts at quorum 1; the gate raises it to policy's 2.
    early = request_approval(agent, run_id, tool=QUORUM_TOOL, arguments=ARGS_B)
    assert early.quorum == 1
    assert state_name(decide(reviewer, early.approval_id).state) == "APPROVED"
    raised = agent.gate.AuthorizeEffect(wire(run_id, "k2", tool=QUORUM_TOOL, arguments=ARGS_B))
    assert outcome_name(raised) == "REQUIRE_APPROVAL" and raised.approval_request_id == early.approval_id
    reopened = get(agent, early.approval_id)
    assert reopened.quorum == 2 and state_name(reopened.state) == "PENDING"
    decide(reviewer2, early.approval_id)
    second = agent.gate.AuthorizeEffect(wire(run_id, "k2", tool=QUORUM_TOOL, arguments=ARGS_B))
    assert outcome_name(second) == "ALLOW" and second.approval_id == early.approval_id
    for client in (agent, admin, reviewer, reviewer2):
        client.close()


def test_a_reusable_approval_on_a_reuse_listed_tool_allows_again(policy_server, tenant):
    agent, admin, reviewer = (tenant.client(policy_server, p) for p in ("agent", "admin", "reviewer"))
    admin.tools.PutToolContract(irreversible(REUSE_TOOL))
    run_id = new_run(agent)
    approval = request_approval(agent, run_id, tool=REUSE_TOOL, reusable=True)
    assert approval.reusable
    decide(reviewer, approval.approval_id)

    first = agent.gate.AuthorizeEffect(wire(run_id, "k1", tool=REUSE_TOOL))
    second = agent.gate.AuthorizeEffect(wire(run_id, "k2", tool=REUSE_TOOL))
    assert outcome_name(first) == outcome_name(second) == "ALLOW"
    assert first.approval_id == second.approval_id == approval.approval_id
    assert first.effect_id != second.effect_id
    for allowed in (first, second):
        effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
        assert [a.approval_id for a in effect.attempts] == [approval.approval_id]
    kept = get(agent, approval.approval_id)
    assert state_name(kept.state) == "APPROVED" and not kept.consumed_by_attempt
    agent.gate.RecordOutcome(succeeded(first.attempt_id))

    revoke(reviewer, approval.approval_id, "enough")
    third = agent.gate.AuthorizeEffect(wire(run_id, "k3", tool=REUSE_TOOL))
    assert outcome_name(third) == "REQUIRE_APPROVAL" and third.approval_request_id != approval.approval_id
    for client in (agent, admin, reviewer):
        client.close()


def test_a_reusable_approval_is_single_use_under_the_shipped_policy(agent, admin, reviewer):
    admin.tools.PutToolContract(irreversible(REUSE_TOOL))
    run_id = new_run(agent)
    approval = request_approval(agent, run_id, tool=REUSE_TOOL, reusable=True)
    decide(reviewer, approval.approval_id)
    first = agent.gate.AuthorizeEffect(wire(run_id, "k1", tool=REUSE_TOOL))
    assert outcome_name(first) == "ALLOW" and first.approval_id == approval.approval_id
    used = get(agent, approval.approval_id)
    assert state_name(used.state) == "CONSUMED" and used.consumed_by_attempt == first.attempt_id
    second = agent.gate.AuthorizeEffect(wire(run_id, "k2", tool=REUSE_TOOL))
    assert outcome_name(second) == "REQUIRE_APPROVAL" and not second.attempt_id
    assert second.approval_request_id not in ("", approval.approval_id)
    assert stage_name(agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id)).stage) == "AUTHORIZED"


def test_an_approval_never_counts_for_the_principal_that_approved_it(tenant, server, agent, admin):
    """Four eyes: a principal with both the agent and the reviewer role approves a request
    another agent filed; it cannot then execute the effect on that approval itself."""
    admin.tools.PutToolContract(irreversible())
    tenant.add("dual", "agent", "reviewer")
    dual = tenant.client(server, "dual")
    run_id = new_run(agent)
    approval_id = agent.gate.AuthorizeEffect(wire(run_id, "k-requested")).approval_request_id
    assert state_name(decide(dual, approval_id).state) == "APPROVED"

    answer = dual.gate.AuthorizeEffect(wire(run_id, "k-dual"))
    assert outcome_name(answer) != "ALLOW" and not answer.attempt_id
    seen = {a["approval_id"]: a for a in policy_input(dual, answer.decision_id)["approvals"]}
    assert "APPROVED_BY_EXECUTOR" in seen[approval_id]["binding_problems"]
    assert "dual" not in seen[approval_id]["valid_approvers"]
    assert state_name(get(agent, approval_id).state) == "APPROVED"  # nothing used up

    # The same approval allows a principal that did not approve it.
    allowed = agent.gate.AuthorizeEffect(wire(run_id, "k-requested"))
    assert outcome_name(allowed) == "ALLOW" and allowed.approval_id == approval_id
