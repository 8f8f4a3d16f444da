"""Every rule the gate enforces, over real gRPC, on PostgreSQL and on SQLite."""

from __future__ import annotations

import json
import time

import pytest

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2, tools_pb2
from support import (
    authorize_request,
    contract,
    failed,
    new_run,
    outcome_name,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)


def events_of(client, run_id: str) -> list:
    return list(client.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events)


def reason_codes(response) -> list[str]:
    return [reason.code for reason in response.reasons]


# --- idempotency ---------------------------------------------------------------------------


def test_open_effect_answers_reconcile_required_at_every_open_stage(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(first) == "ALLOW"
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))) == "RECONCILE_REQUIRED"
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    dispatched = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(dispatched) == "RECONCILE_REQUIRED" and dispatched.effect_id == first.effect_id
    agent.gate.RecordOutcome(unknown(first.attempt_id))
    after_unknown = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(after_unknown) == "RECONCILE_REQUIRED"
    assert stage_name(after_unknown.effect_stage) == "UNKNOWN" and not after_unknown.attempt_id
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id))
    assert len(effect.attempts) == 1


def test_retry_same_key_reuses_the_provider_key(agent, admin):
    admin.tools.PutToolContract(contract(allowed_recovery=(common_pb2.RETRY_SAME_KEY,), max_attempts=3))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agent.gate.RecordOutcome(unknown(first.attempt_id))
    retry = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(retry) == "ALLOW" and retry.provider_key_reused
    assert retry.provider_idempotency_key == first.provider_idempotency_key
    assert retry.attempt_id != first.attempt_id and retry.attempt_number == 2
    third = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(third) == "ALLOW"
    with_limit = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(with_limit) == "DENY" and "RETRY_LIMIT_EXCEEDED" in reason_codes(with_limit)


def test_definite_failure_allows_a_new_attempt_with_a_fresh_key_until_max_attempts(agent, admin):
    admin.tools.PutToolContract(contract(max_attempts=2))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agent.gate.RecordOutcome(failed(first.attempt_id))
    second = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(second) == "ALLOW" and not second.provider_key_reused
    assert second.provider_idempotency_key != first.provider_idempotency_key
    agent.gate.RecordOutcome(failed(second.attempt_id, gate_pb2.NOT_SENT, "never sent"))
    third = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(third) == "DENY" and reason_codes(third)[0] == "RETRY_LIMIT_EXCEEDED"
    decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=third.decision_id))
    assert common_pb2.Outcome.Name(decision.outcome) == "DENY"


def test_same_key_with_other_arguments_is_refused_and_recorded(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=b'{"a":1,"b":[1,2]}'))
    reordered = agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=b'{ "b" : [1, 2], "a" : 1.0 }'))
    assert reordered.intent_digest == first.intent_digest
    assert outcome_name(reordered) == "RECONCILE_REQUIRED"
    for changed in (
        authorize_request(run_id, "k", arguments=b'{"a":2,"b":[1,2]}'),
        authorize_request(run_id, "k", arguments=b'{"a":1,"b":[1,2]}', target="mailto:eve@example.com"),
    ):
        with raises_error("FAILED_PRECONDITION", "IDEMPOTENCY_KEY_REUSED"):
            agent.gate.AuthorizeEffect(changed)
        error = raises_error.last
        assert error.metadata["effect_id"] == first.effect_id
        refusal = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=error.metadata["decision_id"]))
        assert common_pb2.Outcome.Name(refusal.outcome) == "DENY"
        assert [r.code for r in refusal.reasons] == ["IDEMPOTENCY_KEY_REUSED"]
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id))
    assert len(effect.attempts) == 1 and json.loads(effect.arguments_json) == {"a": 1, "b": [1, 2]}


# --- stages --------------------------------------------------------------------------------


def test_stage_never_regresses_and_conflicts_are_refused_but_kept(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordOutcome(succeeded(first.attempt_id, "ref-1"))
    late = agent.gate.RecordOutcome(unknown(first.attempt_id, "timeout reported late"))
    assert not late.changed and stage_name(late.attempt.stage) == "SUCCEEDED"
    echo = agent.gate.RecordOutcome(succeeded(first.attempt_id, "ref-1"))
    assert not echo.changed
    with raises_error("FAILED_PRECONDITION", "CONFLICTING_OUTCOME"):
        agent.gate.RecordOutcome(failed(first.attempt_id))
    with raises_error("FAILED_PRECONDITION", "CONFLICTING_OUTCOME"):
        agent.gate.RecordOutcome(succeeded(first.attempt_id, "ref-2"))
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id))
    assert stage_name(effect.stage) == "SUCCEEDED" and effect.receipt.provider_reference == "ref-1"
    types = [e.type for e in events_of(agent, run_id)]
    assert types.count("attempt.report_refused") == 2 and types.count("attempt.report_superseded") == 1
    refused = [json.loads(e.payload_json) for e in events_of(agent, run_id) if e.type == "attempt.report_refused"]
    assert {r["report"] for r in refused} == {"FAILED", "SUCCEEDED"}
    assert refused[1]["receipt"]["provider_reference"] == "ref-2"


def test_failed_must_say_why_it_is_definite(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    with raises_error("INVALID_ARGUMENT", "FIELD_REQUIRED"):
        agent.gate.RecordOutcome(failed(first.attempt_id, evidence=0))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    with raises_error("FAILED_PRECONDITION", "DISPATCH_RECORDED"):
        agent.gate.RecordOutcome(failed(first.attempt_id, gate_pb2.NOT_SENT))
    with raises_error("INVALID_ARGUMENT", "FIELD_REQUIRED"):
        agent.gate.RecordOutcome(gate_pb2.RecordOutcomeRequest(attempt_id=first.attempt_id))


def test_release_before_dispatch_gives_the_authorization_back(agent, admin):
    admin.tools.PutToolContract(contract(max_attempts=1))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    released = agent.gate.ReleaseAttempt(
        gate_pb2.ReleaseAttemptRequest(attempt_id=first.attempt_id, reason="plan changed")
    )
    assert stage_name(released.attempt.stage) == "RELEASED" and stage_name(released.effect_stage) == "RELEASED"
    with raises_error("FAILED_PRECONDITION", "ATTEMPT_RELEASED"):
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(again) == "ALLOW", "a released attempt does not count against max_attempts"
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=again.attempt_id))
    with raises_error("FAILED_PRECONDITION", "ATTEMPT_NOT_RELEASABLE"):
        agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=again.attempt_id))


def test_lease_expiry_makes_the_attempt_unknown_until_reconciled(agent, admin):
    admin.tools.PutToolContract(contract(lease_seconds=1))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    renewed = agent.gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=first.attempt_id))
    assert renewed.attempt.lease_expires_at.ToDatetime() >= first.lease_expires_at.ToDatetime()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listed = agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
        if listed and stage_name(listed[0].stage) == "UNKNOWN":
            break
        time.sleep(0.2)
    assert [stage_name(e.stage) for e in listed] == ["UNKNOWN"]
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))) == "RECONCILE_REQUIRED"
    with raises_error("FAILED_PRECONDITION", "LEASE_EXPIRED"):
        agent.gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=first.attempt_id))
    with raises_error("FAILED_PRECONDITION", "RECONCILE_REQUIRED"):
        agent.gate.RecordOutcome(succeeded(first.attempt_id))
    reconciled = agent.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=first.effect_id,
            receipt=common_pb2.Receipt(provider_reference="found-by-query", detail_json=b'{"queried":true}'),
        )
    )
    assert stage_name(reconciled.stage) == "SUCCEEDED" and reconciled.reconciled_by == "agent"
    assert reconciled.attempts[0].receipt.provider_reference == "found-by-query"
    assert not agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))) == "DUPLICATE"
    types = [e.type for e in events_of(agent, run_id)]
    assert "attempt.lease_expired" in types and types[-1] == "effect.reconciled"


def test_reconcile_not_happened_reopens_the_effect_for_a_new_attempt(agent, admin, operator):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agent.gate.RecordOutcome(unknown(first.attempt_id))
    with raises_error("INVALID_ARGUMENT"):
        agent.gate.ReconcileEffect(gate_pb2.ReconcileEffectRequest(effect_id=first.effect_id))
    not_happened = gate_pb2.ReconcileEffectRequest(
        effect_id=first.effect_id,
        not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="provider has no message with our key"),
    )
    # The agent cannot clear its own uncertainty (the contract lists no recovery it may use).
    with raises_error("PERMISSION_DENIED", "RECONCILE_NEEDS_OPERATOR"):
        agent.gate.ReconcileEffect(not_happened)
    settled = operator.gate.ReconcileEffect(not_happened)
    assert stage_name(settled.stage) == "FAILED"
    assert "provider has no message" in settled.attempts[0].outcome_reason
    with raises_error("FAILED_PRECONDITION", "CONFLICTING_OUTCOME"):
        agent.gate.ReconcileEffect(
            gate_pb2.ReconcileEffectRequest(
                effect_id=first.effect_id, receipt=common_pb2.Receipt(provider_reference="x")
            )
        )
    retry = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(retry) == "ALLOW" and retry.attempt_number == 2


# --- tools and policy ----------------------------------------------------------------------


def test_unknown_and_retired_tools_are_denied_and_a_new_contract_starts_fresh(agent, admin):
    run_id = new_run(agent)
    unknown_tool = agent.gate.AuthorizeEffect(authorize_request(run_id, "k0", tool="never.registered"))
    assert outcome_name(unknown_tool) == "DENY" and reason_codes(unknown_tool) == ["TOOL_UNKNOWN"]
    assert not unknown_tool.effect_id
    first = admin.tools.PutToolContract(contract("sms.send"))
    assert first.revision == 1
    same = admin.tools.PutToolContract(contract("sms.send"))
    assert same.revision == 1, "an identical put changes nothing"
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k1", tool="sms.send"))
    assert outcome_name(allowed) == "ALLOW" and allowed.tool_revision == 1
    retired = admin.tools.RetireTool(tools_pb2.RetireToolRequest(tool="sms.send", reason="vendor dropped"))
    assert retired.retired and retired.revision == 2
    denied = agent.gate.AuthorizeEffect(authorize_request(run_id, "k2", tool="sms.send"))
    assert outcome_name(denied) == "DENY" and "TOOL_RETIRED" in reason_codes(denied)
    old = admin.tools.GetToolContract(tools_pb2.GetToolContractRequest(tool="sms.send", revision=1))
    assert not old.retired, "history stays readable"
    listed = admin.tools.ListToolContracts(tools_pb2.ListToolContractsRequest())
    assert "sms.send" not in [c.tool for c in listed.contracts]
    revived = admin.tools.PutToolContract(contract("sms.send"))
    assert revived.revision == 3 and not revived.retired
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k3", tool="sms.send"))) == "ALLOW"


def test_an_effect_stays_pinned_to_the_revision_it_was_authorized_under(agent, admin):
    admin.tools.PutToolContract(contract(max_attempts=2))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordOutcome(failed(first.attempt_id))
    admin.tools.PutToolContract(contract(max_attempts=1, lease_seconds=30))
    retry = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    assert outcome_name(retry) == "ALLOW", "the pinned revision allows 2 attempts"
    assert retry.tool_revision == 1 and retry.intent_digest == first.intent_digest
    fresh = agent.gate.AuthorizeEffect(authorize_request(run_id, "other-key"))
    assert fresh.tool_revision == 2 and fresh.intent_digest != first.intent_digest


def test_irreversible_tools_require_approval_and_create_nothing(agent, admin):
    admin.tools.PutToolContract(
        contract("payments.charge", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False)
    )
    run_id = new_run(agent)
    answer = agent.gate.AuthorizeEffect(authorize_request(run_id, "pay-1", tool="payments.charge"))
    assert outcome_name(answer) == "REQUIRE_APPROVAL" and reason_codes(answer) == ["IRREVERSIBLE_TOOL"]
    assert not answer.attempt_id and not answer.effect_id
    assert not agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects


def test_a_target_with_an_unknown_effect_blocks_new_effects_of_that_tool(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k1"))
    agent.gate.RecordOutcome(unknown(first.attempt_id))
    blocked = agent.gate.AuthorizeEffect(authorize_request(run_id, "k2", arguments=b'{"subject":"another"}'))
    assert outcome_name(blocked) == "DENY" and reason_codes(blocked) == ["TARGET_HAS_UNKNOWN_EFFECT"]
    elsewhere = agent.gate.AuthorizeEffect(authorize_request(run_id, "k3", target="mailto:carol@example.com"))
    assert outcome_name(elsewhere) == "ALLOW"
    decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=blocked.decision_id))
    policy_input = json.loads(decision.input_json)
    assert policy_input["target_unknown_effects"][0]["effect_id"] == first.effect_id
    assert {e["effect_id"] for e in policy_input["run_open_effects"]} == {first.effect_id}
    assert policy_input["principal"] == {
        "id": "agent",
        "tenant": policy_input["principal"]["tenant"],
        "roles": ["agent"],
    }
    assert decision.engine == "embedded-regorus" and len(decision.input_digest) == 64


def test_arguments_must_satisfy_the_contract_schema(agent, admin):
    schema = json.dumps({"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}}).encode()
    admin.tools.PutToolContract(contract(arguments_schema_json=schema))
    run_id = new_run(agent)
    with raises_error("INVALID_ARGUMENT", "ARGUMENTS_SCHEMA_VIOLATION"):
        agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=b'{"to": 5}'))
    assert raises_error.last.violations[0].field == "arguments_json['to']"
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=b'{"to":"x"}'))) == "ALLOW"


@pytest.mark.parametrize(
    "arguments, reason",
    [
        (b"[1,2]", "JSON_NOT_OBJECT"),
        (b'{"a":1,"a":2}', "JSON_INVALID"),
        (b'{"a":12345678901234567891}', "JSON_INVALID"),
        (b'{"a":NaN}', "JSON_INVALID"),
        (b'{"a":"\xff"}', "JSON_INVALID_UTF8"),
        (b"", "JSON_REQUIRED"),
        (b'{"a":"' + b"x" * 70_000 + b'"}', "JSON_TOO_LARGE"),
    ],
)
def test_bad_arguments_are_invalid_argument_with_a_field_violation(agent, admin, arguments, reason):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    with raises_error("INVALID_ARGUMENT", reason):
        agent.gate.AuthorizeEffect(authorize_request(run_id, "k", arguments=arguments))
    assert raises_error.last.violations[0].field == "arguments_json"
    assert not agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects


def test_bad_contracts_are_refused_with_every_violation(admin):
    with raises_error("INVALID_ARGUMENT", "INVALID_TOOL_CONTRACT"):
        admin.tools.PutToolContract(
            contract(
                "bad tool name",
                max_attempts=0,
                provider_idempotency=False,
                allowed_recovery=(common_pb2.RETRY_SAME_KEY,),
            )
        )
    fields = {v.field for v in raises_error.last.violations}
    assert {"contract.tool", "contract.max_attempts", "contract.allowed_recovery"} <= fields
    with raises_error("INVALID_ARGUMENT", "FIELD_REQUIRED"):
        admin.tools.PutToolContract(contract(effect_class=0))
    request = contract()
    request.expected_revision = 7
    with raises_error("FAILED_PRECONDITION", "REVISION_MISMATCH"):
        admin.tools.PutToolContract(request)


# --- identity and tenancy ------------------------------------------------------------------


def test_tokens_roles_and_tenants(server, tenant, agent, admin):
    from effect_ledger.client import LedgerClient
    from support import new_tenant

    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    with raises_error("UNAUTHENTICATED", "TOKEN_UNKNOWN"):
        LedgerClient(server.target, "elt_not-a-token").runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    import grpc

    with grpc.insecure_channel(server.target) as channel:
        from effectledger.v1 import runs_pb2_grpc

        with pytest.raises(grpc.RpcError) as caught:
            runs_pb2_grpc.RunsStub(channel).GetRun(runs_pb2.GetRunRequest(run_id=run_id), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    auditor = tenant.client(server, "auditor")
    assert auditor.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).run_id == run_id
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        auditor.gate.AuthorizeEffect(authorize_request(run_id, "k2"))
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        agent.tools.PutToolContract(contract("agent.made"))
    other = new_tenant(tenant.database_url).client(server, "admin")
    for call in (
        lambda: other.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)),
        lambda: other.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id)),
        lambda: other.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=allowed.decision_id)),
        lambda: other.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)),
        lambda: other.gate.ReconcileEffect(
            gate_pb2.ReconcileEffectRequest(
                effect_id=allowed.effect_id, receipt=common_pb2.Receipt(provider_reference="x")
            )
        ),
    ):
        with raises_error("NOT_FOUND"):
            call()
    other_agent_tenant = new_tenant(tenant.database_url)
    with raises_error("NOT_FOUND", "RUN_NOT_FOUND"):
        other_agent_tenant.client(server, "agent").gate.AuthorizeEffect(authorize_request(run_id, "k3"))
    with raises_error("NOT_FOUND", "ATTEMPT_NOT_FOUND"):
        other_agent_tenant.client(server, "agent").gate.RecordDispatch(
            gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id)
        )


def test_create_run_is_idempotent_by_request_id(agent):
    first = agent.runs.CreateRun(runs_pb2.CreateRunRequest(request_id="req-1", labels={"task": "triage"}))
    second = agent.runs.CreateRun(runs_pb2.CreateRunRequest(request_id="req-1", labels={"task": "triage"}))
    assert first.run_id == second.run_id and first.labels["task"] == "triage"
    assert first.revision == 1 and len(first.head_hash) == 64


def test_paging_lists_every_open_effect_once(agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    ids = {
        agent.gate.AuthorizeEffect(authorize_request(run_id, f"k{i}", target=f"mailto:{i}@example.com")).effect_id
        for i in range(7)
    }
    seen, token = [], ""
    while True:
        page = agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id, page_size=3, page_token=token))
        seen.extend(e.effect_id for e in page.effects)
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    with raises_error("INVALID_ARGUMENT", "INVALID_PAGE_SIZE"):
        agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id, page_size=100_000))


def test_a_page_token_this_service_did_not_issue_is_refused(agent):
    run_id = new_run(agent)
    for token in ("%%%", "not base64!", "gA=="):
        with raises_error("INVALID_ARGUMENT", "INVALID_PAGE_TOKEN"):
            agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id, page_token=token))


def test_a_success_under_a_shared_provider_key_settles_the_sibling_attempts(agent, admin):
    """RETRY_SAME_KEY: the provider deduplicates by key, so one receipt settles every attempt
    that used it; nothing stays UNKNOWN (or holds money) behind a SUCCEEDED effect."""
    admin.tools.PutToolContract(contract(allowed_recovery=(common_pb2.RETRY_SAME_KEY,), max_attempts=3))
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agent.gate.RecordOutcome(unknown(first.attempt_id))
    retry = agent.gate.AuthorizeEffect(authorize_request(run_id, "k"))
    agent.gate.RecordOutcome(succeeded(retry.attempt_id, "msg-once"))
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=first.effect_id))
    assert [stage_name(a.stage) for a in effect.attempts] == ["SUCCEEDED", "SUCCEEDED"]
    assert {a.receipt.provider_reference for a in effect.attempts} == {"msg-once"}
    assert "deduplicated" in effect.attempts[0].outcome_reason
    assert [e.type for e in events_of(agent, run_id)][-2:] == ["attempt.succeeded", "attempt.deduplicated"]
