"""The rules of checkpoints, over real gRPC, on PostgreSQL and on SQLite.

Five sibling lifetimes that never turn into one another; a seal that copies the ledger (never the
caller's story) under a manifest whose digests can be recomputed; artifacts that must be complete
to be claimed and whose loss stops or degrades a resume; a registration that freezes its facts;
a resume that restores knowledge but never authority; forks that never re-execute a parent's
effect and never let a simulated world reach a live tool.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from effect_ledger.domain.checkpoints import LATER_SECTIONS, SECTIONS, section_digest
from effectledger.v1 import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    runs_pb2,
    tools_pb2,
)
from support import (
    authorize_request,
    checkpoints_stub,
    contract,
    new_run,
    outcome_name,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)

MAIL = "email.send"
WIRE = "payment.wire"
SEARCH = "search.web"
SANDBOX = "email.sandbox"
USD = "usd_micros"
# Longer than any test: no lease runs out (and turns an attempt UNKNOWN) unless a test wants it.
LEASE_SECONDS = 3600
ARGS = b'{"to":"bob@example.com","subject":"hello"}'
CONTEXT_DIGEST = "sha256:" + hashlib.sha256(b"compiled context manifest").hexdigest()

REQUIRED = checkpoints_pb2.REQUIRED
OPTIONAL = checkpoints_pb2.OPTIONAL


# --- helpers -------------------------------------------------------------------------------


def facts(**overrides) -> checkpoints_pb2.CompatibilityFacts:
    values = {
        "runtime": "agent-runtime/3",
        "contract_schema": "tools/v2",
        "code_version": "1.4.0",
        "checkpoint_format": 2,
    }
    values.update(overrides)
    return checkpoints_pb2.CompatibilityFacts(**values)


def mail(tool: str = MAIL, **overrides) -> tools_pb2.PutToolContractRequest:
    return contract(tool, lease_seconds=LEASE_SECONDS, **overrides)


def irreversible(tool: str = WIRE) -> tools_pb2.PutToolContractRequest:
    return contract(
        tool,
        effect_class=common_pb2.IRREVERSIBLE,
        provider_idempotency=False,
        max_attempts=1,
        lease_seconds=LEASE_SECONDS,
    )


def simulator(tool: str = SANDBOX) -> tools_pb2.PutToolContractRequest:
    request = mail(tool)
    request.contract.simulator = True
    return request


def send(
    run_id: str,
    key: str,
    target: str = "mailto:bob@example.com",
    *,
    tool: str = MAIL,
    arguments: bytes = ARGS,
    usd: int = 0,
) -> gate_pb2.AuthorizeEffectRequest:
    request = authorize_request(run_id, key, tool=tool, arguments=arguments, target=target)
    if usd:
        request.estimate[USD] = usd
    return request


def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


def codes(response) -> list[str]:
    return [reason.code for reason in response.reasons]


def status_name(value: int) -> str:
    return checkpoints_pb2.CheckpointStatus.Name(value)


def verdict_name(value: int) -> str:
    return checkpoints_pb2.Verdict.Name(value)


def artifact_status(value: int) -> str:
    return checkpoints_pb2.ArtifactStatus.Name(value)


def revision_of(client, run_id: str) -> int:
    return client.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision


def events_of(client, run_id: str) -> list[runs_pb2.RunEvent]:
    found, after = [], 0
    while True:
        page = client.runs.ListRunEvents(
            runs_pb2.ListRunEventsRequest(run_id=run_id, after_revision=after, page_size=1000)
        )
        found.extend(page.events)
        if not page.next_after_revision:
            return found
        after = page.next_after_revision


def payload(event) -> dict:
    return json.loads(event.payload_json)


def seal(checkpoints, client, run_id: str, *, state: bytes = b'{"step":1}', artifacts=(), sealed_facts=None):
    return checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id,
            expected_revision=revision_of(client, run_id),
            state_json=state,
            artifacts=list(artifacts),
            facts=sealed_facts if sealed_facts is not None else facts(),
        )
    )


def register(checkpoints, checkpoint_id: str, registered_facts=None):
    request = checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=checkpoint_id)
    if registered_facts is not None:
        request.facts.CopyFrom(registered_facts)
    return checkpoints.RegisterCheckpoint(request)


def check(checkpoints, checkpoint_id: str, current) -> checkpoints_pb2.CompatibilityVerdict:
    return checkpoints.CheckResumeCompatibility(
        checkpoints_pb2.CheckResumeCompatibilityRequest(checkpoint_id=checkpoint_id, current=current)
    )


def resume(
    checkpoints,
    checkpoint_id: str,
    *,
    current=None,
    provider: str = "provider-b",
    model: str = "model-b",
    adapter: str = "adapter-b",
    reason: str = "provider session lost",
    context_digest: str = "",
):
    return checkpoints.ResumeRun(
        checkpoints_pb2.ResumeRunRequest(
            checkpoint_id=checkpoint_id,
            configuration=checkpoints_pb2.Configuration(provider=provider, model=model, adapter=adapter),
            reason=reason,
            current=current if current is not None else facts(),
            context_manifest_digest=context_digest,
        )
    )


def fork(checkpoints, checkpoint_id: str, world: int, difference: str = "model B instead of model A"):
    return checkpoints.ForkRun(
        checkpoints_pb2.ForkRunRequest(checkpoint_id=checkpoint_id, world=world, difference=difference)
    )


def dispatch_unknown(agent, attempt_id: str, reason: str = "connection reset after sending") -> None:
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=attempt_id))
    agent.gate.RecordOutcome(unknown(attempt_id, reason))


def get_effect(client, effect_id: str) -> gate_pb2.Effect:
    return client.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))


def budget(client, scope: int, scope_id: str, dimension: str = USD) -> budgets_pb2.Budget:
    found = [
        b
        for b in client.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=scope, scope_id=scope_id)).budgets
        if b.dimension == dimension
    ]
    assert len(found) == 1, found
    return found[0]


def put_budget(admin, scope: int, scope_id: str, limit: int, dimension: str = USD) -> budgets_pb2.Budget:
    return admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=scope, scope_id=scope_id, dimension=dimension, limit=limit)
    )


def record_usage(client, run_id: str, amount: int, *, provider: str, model: str, segment: str):
    return client.budgets.RecordUsage(
        budgets_pb2.RecordUsageRequest(
            run_id=run_id, provider=provider, model=model, segment=segment, usage={USD: amount}
        )
    )


def request_approval(agent, run_id: str, arguments: bytes, target: str = "bank:acct-1") -> approvals_pb2.Approval:
    return agent.approvals.RequestApproval(
        approvals_pb2.RequestApprovalRequest(
            run_id=run_id, tool=WIRE, arguments_json=arguments, target=target, reason="please"
        )
    )


def decide(reviewer, approval_id: str, approve: bool) -> approvals_pb2.Approval:
    return reviewer.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=approve, comment="checked")
    )


@pytest.fixture
def checkpoints(server, tenant):
    return checkpoints_stub(server, tenant.tokens["agent"])


# --- lifetimes -----------------------------------------------------------------------------


def test_sibling_lifetimes_have_their_own_ids_and_none_stands_for_a_checkpoint(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    run_id = new_run(agent)

    snapshot = checkpoints.RecordSnapshot(
        checkpoints_pb2.RecordSnapshotRequest(run_id=run_id, value_json=b'{"inbox":3}')
    )
    assert snapshot.snapshot_id and snapshot.run_id == run_id and json.loads(snapshot.value_json) == {"inbox": 3}
    assert snapshot.created_at.seconds > 0
    expires = Timestamp(seconds=4102444800)  # 2100-01-01
    session = checkpoints.RecordProviderSession(
        checkpoints_pb2.RecordProviderSessionRequest(
            run_id=run_id, provider="openai", session_id="sess-1", response_id="resp-9", expires_at=expires
        )
    )
    assert session.reference_id and session.run_id == run_id
    assert (session.provider, session.session_id, session.response_id) == ("openai", "sess-1", "resp-9")
    assert session.expires_at == expires and session.observed_at.seconds > 0
    handle = checkpoints.RecordExecutionHandle(
        checkpoints_pb2.RecordExecutionHandleRequest(run_id=run_id, runtime="temporal", handle="wf-42")
    )
    assert handle.handle_id and handle.run_id == run_id and (handle.runtime, handle.handle) == ("temporal", "wf-42")
    ids = [snapshot.snapshot_id, session.reference_id, handle.handle_id]
    assert len(set(ids)) == 3
    # The provider session is an adapter observation in the trace, not a checkpoint.
    observed = [e for e in events_of(agent, run_id) if e.type == "adapter.provider_session_observed"]
    assert len(observed) == 1 and payload(observed[0])["reference_id"] == session.reference_id
    assert not checkpoints.ListCheckpoints(checkpoints_pb2.ListCheckpointsRequest(run_id=run_id)).checkpoints

    # None of these ids is accepted where a checkpoint id is expected.
    for other_id in ids:
        with raises_error("NOT_FOUND"):
            checkpoints.GetCheckpoint(checkpoints_pb2.GetCheckpointRequest(checkpoint_id=other_id))
        with raises_error("NOT_FOUND"):
            register(checkpoints, other_id)
        with raises_error("NOT_FOUND"):
            check(checkpoints, other_id, facts())
        with raises_error("NOT_FOUND"):
            resume(checkpoints, other_id)
        with raises_error("NOT_FOUND"):
            fork(checkpoints, other_id, checkpoints_pb2.LIVE)
        with raises_error("NOT_FOUND"):
            fork(checkpoints, other_id, checkpoints_pb2.SIMULATED)

    # A sealed checkpoint that is not registered yet can be neither resumed nor forked.
    sealed = seal(checkpoints, agent, run_id)
    assert status_name(sealed.status) == "SEALED"
    verdict = check(checkpoints, sealed.checkpoint_id, facts())
    assert verdict_name(verdict.verdict) == "INCOMPATIBLE"
    assert [(f.fact, f.degraded_only) for f in verdict.facts] == [("status", False)]
    before = revision_of(agent, run_id)
    with raises_error("FAILED_PRECONDITION", "CHECKPOINT_INCOMPATIBLE"):
        resume(checkpoints, sealed.checkpoint_id)
    refused = raises_error.last
    assert [v.subject for v in refused.violations] == ["status"]
    assert refused.metadata["checkpoint_id"] == sealed.checkpoint_id
    with raises_error("FAILED_PRECONDITION", "NOT_REGISTERED"):
        fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.LIVE)
    with raises_error("FAILED_PRECONDITION", "NOT_REGISTERED"):
        fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.SIMULATED)
    # Neither refusal wrote anything: no transition, no segment, no child run.
    assert revision_of(agent, run_id) == before
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).segment == 1

    # A live continuation is never stored, whatever it carries, nor smuggled in as a snapshot.
    for value in (b"", b"socket:fd=7", b'{"lifetime":"snapshot"}'):
        with raises_error("FAILED_PRECONDITION", "LIVE_CONTINUATION_NOT_STORABLE"):
            checkpoints.StoreLiveContinuation(checkpoints_pb2.LiveContinuation(value=value))
    with raises_error("FAILED_PRECONDITION", "LIVE_CONTINUATION_NOT_STORABLE"):
        checkpoints.RecordSnapshot(
            checkpoints_pb2.RecordSnapshotRequest(run_id=run_id, value_json=b'{"lifetime":"live_continuation","fd":7}')
        )
    assert [v.subject for v in raises_error.last.violations] == ["lifetime/live_continuation"]


# --- seal ----------------------------------------------------------------------------------


def test_seal_copies_the_ledger_not_the_callers_story_under_recomputable_digests(agent, admin, reviewer, checkpoints):
    admin.tools.PutToolContract(mail())
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    put_budget(admin, budgets_pb2.RUN, run_id, 10_000)

    done = agent.gate.AuthorizeEffect(send(run_id, "k-done", usd=100))
    assert outcome_name(done) == "ALLOW"
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=done.attempt_id))
    outcome = succeeded(done.attempt_id, "msg-done")
    outcome.succeeded.usage[USD] = 80
    agent.gate.RecordOutcome(outcome)
    lost = agent.gate.AuthorizeEffect(send(run_id, "k-lost", "mailto:carol@example.com", usd=200))
    dispatch_unknown(agent, lost.attempt_id)
    admin.tools.PutToolContract(mail(max_attempts=5))  # revision 2: the next effect pins it
    waiting = agent.gate.AuthorizeEffect(send(run_id, "k-open", "mailto:dave@example.com", usd=300))
    assert outcome_name(waiting) == "ALLOW" and waiting.tool_revision == 2

    pending = request_approval(agent, run_id, b'{"amount":1}')
    active = request_approval(agent, run_id, b'{"amount":2}')
    denied = request_approval(agent, run_id, b'{"amount":3}')
    decide(reviewer, active.approval_id, True)
    decide(reviewer, denied.approval_id, False)

    state = {"summary": "nothing happened", "effects": [], "open_effects": [], "approvals": [], "budgets": {}}
    revision = revision_of(agent, run_id)
    sealed = checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id, expected_revision=revision, state_json=json.dumps(state).encode(), facts=facts()
        )
    )
    assert sealed.revision == revision and status_name(sealed.status) == "SEALED"
    assert json.loads(sealed.state_json) == state
    ledger = json.loads(sealed.ledger_json)

    # Effects: what the ledger holds, whatever the state claims.
    open_effects = {e["effect_id"]: e for e in ledger["effects"]["open"]}
    assert set(open_effects) == {lost.effect_id, waiting.effect_id}
    stored_lost = get_effect(agent, lost.effect_id)
    copied = open_effects[lost.effect_id]
    assert copied["stage"] == "UNKNOWN" and copied["tool"] == MAIL and copied["tool_revision"] == 1
    assert copied["target"] == "mailto:carol@example.com" and copied["idempotency_key"] == "k-lost"
    assert copied["intent_digest"] == lost.intent_digest and copied["arguments"] == json.loads(ARGS)
    assert copied["contract"]["tool"] == MAIL and copied["contract"]["revision"] == 1
    assert copied["contract"]["max_attempts"] == 3 and copied["contract"]["effect_class"] == "RETRYABLE_WITH_KEY"
    assert [
        (a["attempt_id"], a["number"], a["stage"], a["provider_idempotency_key"], a["outcome_reason"], a["receipt"])
        for a in copied["attempts"]
    ] == [
        (a.attempt_id, a.number, stage_name(a.stage), a.provider_idempotency_key, a.outcome_reason, None)
        for a in stored_lost.attempts
    ]
    assert (
        copied["attempts"][0]["stage"] == "UNKNOWN"
        and copied["attempts"][0]["outcome_reason"] == "connection reset after sending"
    )
    assert copied["attempts"][0]["provider_idempotency_key"] == lost.provider_idempotency_key
    copied_open = open_effects[waiting.effect_id]
    assert copied_open["stage"] == "AUTHORIZED" and copied_open["tool_revision"] == 2
    assert copied_open["contract"]["revision"] == 2 and copied_open["contract"]["max_attempts"] == 5
    assert [a["attempt_id"] for a in copied_open["attempts"]] == [waiting.attempt_id]
    settled = {e["effect_id"]: e for e in ledger["effects"]["settled"]}
    assert set(settled) == {done.effect_id}
    assert settled[done.effect_id]["stage"] == "SUCCEEDED"
    assert settled[done.effect_id]["receipt_digest"] == get_effect(agent, done.effect_id).receipt.digest != ""

    # Approvals: pending, active and denied, as the ledger holds them.
    approvals = ledger["approvals"]
    assert [a["approval_id"] for a in approvals["pending"]] == [pending.approval_id]
    assert [a["approval_id"] for a in approvals["active"]] == [active.approval_id]
    assert [a["approval_id"] for a in approvals["denied"]] == [denied.approval_id]
    assert approvals["active"][0]["state"] == "APPROVED" and approvals["denied"][0]["state"] == "DENIED"
    assert approvals["active"][0]["tool"] == WIRE and approvals["active"][0]["intent_digest"] == active.intent_digest
    assert [v["reviewer_id"] for v in approvals["active"][0]["votes"]] == ["reviewer"]

    # Budgets: the counters and every open reservation of the run.
    live = budget(agent, budgets_pb2.RUN, run_id)
    assert (live.posted, live.pending) == (80, 500)
    [copied_budget] = ledger["budgets"]["budgets"]
    assert copied_budget["budget_id"] == live.budget_id and copied_budget["scope"] == "RUN"
    assert (copied_budget["limit"], copied_budget["posted"], copied_budget["pending"]) == (10_000, 80, 500)
    reservations = {r["reservation_id"]: r for r in ledger["budgets"]["open_reservations"]}
    assert set(reservations) == set(lost.reservation_ids) | set(waiting.reservation_ids)
    assert {(r["effect_id"], r["amount"]) for r in reservations.values()} == {
        (lost.effect_id, 200),
        (waiting.effect_id, 300),
    }

    # Tools: the pinned revisions of every effect and the contract in force.
    assert set(ledger["tools"]) == {MAIL}
    assert ledger["tools"][MAIL]["pinned_revisions"] == [1, 2]
    assert ledger["tools"][MAIL]["current"]["revision"] == 2

    # Policy: the revision the gate decided under.
    assert {done.policy_revision, lost.policy_revision, waiting.policy_revision} == {ledger["policy"]["revision"]}
    assert sealed.policy_revision == ledger["policy"]["revision"] != ""

    # The manifest: every digest recomputes from the returned components.
    manifest = json.loads(sealed.manifest_json)
    assert set(manifest["sections"]) == set(SECTIONS) | set(LATER_SECTIONS) == set(ledger)
    for name in (*SECTIONS, *LATER_SECTIONS):
        assert manifest["sections"][name] == section_digest(ledger[name]), name
    assert manifest["state_digest"] == section_digest(state)
    assert manifest["artifacts"] == []
    assert (manifest["checkpoint_id"], manifest["run_id"], manifest["revision"]) == (
        sealed.checkpoint_id,
        run_id,
        revision,
    )
    assert manifest["policy_revision"] == sealed.policy_revision
    assert sealed.manifest_digest == section_digest(manifest)

    stored = checkpoints.GetCheckpoint(checkpoints_pb2.GetCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    assert (stored.ledger_json, stored.manifest_json, stored.manifest_digest) == (
        sealed.ledger_json,
        sealed.manifest_json,
        sealed.manifest_digest,
    )
    event = events_of(agent, run_id)[-1]
    assert (event.type, event.revision) == ("checkpoint.sealed", revision + 1)
    assert payload(event)["manifest_digest"] == sealed.manifest_digest
    assert set(payload(event)["open_effects"]) == {lost.effect_id, waiting.effect_id}


# --- artifacts -----------------------------------------------------------------------------


def test_artifacts_must_be_complete_to_be_claimed_and_their_loss_stops_or_degrades_a_resume(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    run_id = new_run(agent)
    unique = uuid.uuid4().hex.encode()

    overlay_content = b"workspace overlay " + unique
    overlay = checkpoints.PutArtifact(
        checkpoints_pb2.PutArtifactRequest(content=overlay_content, media_type="application/x-tar")
    )
    assert overlay.digest == "sha256:" + hashlib.sha256(overlay_content).hexdigest()
    assert artifact_status(overlay.status) == "ARTIFACT_COMPLETE" and overlay.size_bytes == len(overlay_content)
    notes = checkpoints.PutArtifact(
        checkpoints_pb2.PutArtifactRequest(content=b"notes " + unique, media_type="text/plain")
    )
    assert artifact_status(notes.status) == "ARTIFACT_COMPLETE"

    big_digest = "sha256:" + hashlib.sha256(b"a large model snapshot " + unique).hexdigest()
    with raises_error("INVALID_ARGUMENT"):
        checkpoints.DeclareArtifact(
            checkpoints_pb2.DeclareArtifactRequest(
                digest=big_digest,
                size_bytes=10 << 20,
                media_type="application/octet-stream",
                location="https://user:pw@host/x",
            )
        )
    big = checkpoints.DeclareArtifact(
        checkpoints_pb2.DeclareArtifactRequest(
            digest=big_digest,
            size_bytes=10 << 20,
            media_type="application/octet-stream",
            location="https://storage.example.com/bucket/big.bin",
        )
    )
    assert (
        artifact_status(big.status) == "ARTIFACT_PENDING"
        and big.location == "https://storage.example.com/bucket/big.bin"
    )

    big_ref = checkpoints_pb2.ArtifactRef(name="model/big.bin", digest=big_digest, classification=REQUIRED)
    overlay_ref = checkpoints_pb2.ArtifactRef(
        name="workspace/overlay.tar", digest=overlay.digest, classification=REQUIRED
    )
    notes_ref = checkpoints_pb2.ArtifactRef(name="notes.txt", digest=notes.digest, classification=OPTIONAL)

    before = revision_of(agent, run_id)
    with raises_error("FAILED_PRECONDITION", "ARTIFACT_INCOMPLETE"):
        seal(checkpoints, agent, run_id, artifacts=[overlay_ref, big_ref])
    refused = raises_error.last
    assert refused.metadata["artifact"] == "model/big.bin" and "model/big.bin" in refused.message
    assert [v.subject for v in refused.violations] == ["artifact/model/big.bin"]
    assert revision_of(agent, run_id) == before  # nothing sealed

    completed = checkpoints.CompleteArtifact(checkpoints_pb2.CompleteArtifactRequest(digest=big_digest))
    assert artifact_status(completed.status) == "ARTIFACT_COMPLETE"

    # A checkpoint with a required and an optional artifact: losing the optional one degrades.
    first = seal(checkpoints, agent, run_id, artifacts=[overlay_ref, notes_ref])
    assert [(a.name, a.classification) for a in first.artifacts] == [
        ("workspace/overlay.tar", REQUIRED),
        ("notes.txt", OPTIONAL),
    ]
    manifest = json.loads(first.manifest_json)
    assert manifest["artifacts"] == [
        {"name": "notes.txt", "digest": notes.digest, "classification": "OPTIONAL"},
        {"name": "workspace/overlay.tar", "digest": overlay.digest, "classification": "REQUIRED"},
    ]
    register(checkpoints, first.checkpoint_id)
    assert verdict_name(check(checkpoints, first.checkpoint_id, facts()).verdict) == "COMPATIBLE"
    tombstone = checkpoints.DeleteArtifact(checkpoints_pb2.DeleteArtifactRequest(digest=notes.digest))
    assert artifact_status(tombstone.status) == "ARTIFACT_TOMBSTONE"
    assert (tombstone.digest, tombstone.media_type, tombstone.size_bytes) == (
        notes.digest,
        "text/plain",
        notes.size_bytes,
    )
    with raises_error("FAILED_PRECONDITION", "ARTIFACT_DELETED"):
        checkpoints.CompleteArtifact(checkpoints_pb2.CompleteArtifactRequest(digest=notes.digest))
    degraded = check(checkpoints, first.checkpoint_id, facts())
    assert verdict_name(degraded.verdict) == "DEGRADED"
    assert [(f.fact, f.degraded_only) for f in degraded.facts] == [("artifact:notes.txt", True)]
    resumed = resume(checkpoints, first.checkpoint_id)
    assert resumed.segment == 2 and verdict_name(resumed.verdict.verdict) == "DEGRADED"
    assert [f.fact for f in resumed.verdict.facts] == ["artifact:notes.txt"]

    # A checkpoint whose required artifact is deleted after registration cannot be resumed.
    second = seal(checkpoints, agent, run_id, artifacts=[big_ref])
    register(checkpoints, second.checkpoint_id)
    assert verdict_name(check(checkpoints, second.checkpoint_id, facts()).verdict) == "COMPATIBLE"
    deleted = checkpoints.DeleteArtifact(checkpoints_pb2.DeleteArtifactRequest(digest=big_digest))
    assert artifact_status(deleted.status) == "ARTIFACT_TOMBSTONE" and deleted.digest == big_digest
    incompatible = check(checkpoints, second.checkpoint_id, facts())
    assert verdict_name(incompatible.verdict) == "INCOMPATIBLE"
    assert [(f.fact, f.degraded_only) for f in incompatible.facts] == [("artifact:model/big.bin", False)]
    assert "tombstone" in incompatible.facts[0].reason
    with raises_error("FAILED_PRECONDITION", "CHECKPOINT_INCOMPATIBLE"):
        resume(checkpoints, second.checkpoint_id)
    assert [v.subject for v in raises_error.last.violations] == ["artifact:model/big.bin"]
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).segment == 2


# --- register and compatibility --------------------------------------------------------------


def test_register_freezes_the_facts_and_each_incompatible_fact_gets_its_own_reason(agent, admin, operator, checkpoints):
    admin.tools.PutToolContract(mail())
    run_id = new_run(agent)
    lost = agent.gate.AuthorizeEffect(send(run_id, "k-lost", "mailto:carol@example.com"))
    dispatch_unknown(agent, lost.attempt_id)
    waiting = agent.gate.AuthorizeEffect(send(run_id, "k-open", "mailto:dave@example.com"))
    assert outcome_name(waiting) == "ALLOW"
    native = ["openai:responses"]
    recorded = facts(native_references=native)
    sealed = seal(checkpoints, agent, run_id, sealed_facts=facts())

    registered = register(checkpoints, sealed.checkpoint_id, recorded)
    assert status_name(registered.status) == "REGISTERED" and registered.registered_by == "agent"
    assert list(registered.facts.native_references) == native
    again = register(checkpoints, sealed.checkpoint_id, recorded)
    assert status_name(again.status) == "REGISTERED" and again.registered_at == registered.registered_at
    unchanged = register(checkpoints, sealed.checkpoint_id)  # no facts: the registered ones
    assert unchanged.registered_at == registered.registered_at and unchanged.facts == registered.facts
    for different in (facts(code_version="1.5.0", native_references=native), facts()):
        with raises_error("FAILED_PRECONDITION", "ALREADY_REGISTERED"):
            register(checkpoints, sealed.checkpoint_id, different)
    stored = checkpoints.GetCheckpoint(checkpoints_pb2.GetCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    assert stored.facts == registered.facts
    assert [e.type for e in events_of(agent, run_id)].count("checkpoint.registered") == 1

    # Everything differs: one reason per fact, each naming what it found.
    everything = check(
        checkpoints,
        sealed.checkpoint_id,
        checkpoints_pb2.CompatibilityFacts(
            runtime="other-runtime/1", contract_schema="tools/v3", code_version="2.0.0", checkpoint_format=1
        ),
    )
    assert verdict_name(everything.verdict) == "INCOMPATIBLE"
    by_fact = {f.fact: f for f in everything.facts}
    assert len(by_fact) == len(everything.facts)
    assert set(by_fact) == {
        "runtime",
        "contract_schema",
        "code_version",
        "checkpoint_format",
        "native_reference:openai:responses",
        f"effect:{lost.effect_id}",
    }
    assert {name for name, f in by_fact.items() if f.degraded_only} == {"native_reference:openai:responses"}
    assert "agent-runtime/3" in by_fact["runtime"].reason and "other-runtime/1" in by_fact["runtime"].reason
    assert "tools/v2" in by_fact["contract_schema"].reason and "tools/v3" in by_fact["contract_schema"].reason
    assert "1.4.0" in by_fact["code_version"].reason and "2.0.0" in by_fact["code_version"].reason
    assert all(f.reason for f in everything.facts)
    # The AUTHORIZED effect is open, not unknown: the resume returns it, it is not a fact.
    assert f"effect:{waiting.effect_id}" not in by_fact

    # One fact at a time.
    carried = {"native_references": native, "recorded_effects": [lost.effect_id]}
    for changed, expected in (
        ({"runtime": "other-runtime/1"}, "runtime"),
        ({"contract_schema": "tools/v3"}, "contract_schema"),
        ({"code_version": "2.0.0"}, "code_version"),
        ({"checkpoint_format": 1}, "checkpoint_format"),
        ({"recorded_effects": []}, f"effect:{lost.effect_id}"),
    ):
        verdict = check(checkpoints, sealed.checkpoint_id, facts(**{**carried, **changed}))
        assert verdict_name(verdict.verdict) == "INCOMPATIBLE", changed
        assert [(f.fact, f.degraded_only) for f in verdict.facts] == [(expected, False)], changed
    only_native = check(checkpoints, sealed.checkpoint_id, facts(recorded_effects=[lost.effect_id]))
    assert verdict_name(only_native.verdict) == "DEGRADED"
    assert [(f.fact, f.degraded_only) for f in only_native.facts] == [("native_reference:openai:responses", True)]
    newer_reader = check(checkpoints, sealed.checkpoint_id, facts(**{**carried, "checkpoint_format": 3}))
    assert verdict_name(newer_reader.verdict) == "COMPATIBLE" and not newer_reader.facts
    matching = check(checkpoints, sealed.checkpoint_id, facts(**carried))
    assert verdict_name(matching.verdict) == "COMPATIBLE" and not matching.facts

    # Once the unknown effect is reconciled, a runtime that does not carry it is compatible.
    operator.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=lost.effect_id, not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="no such message")
        )
    )
    settled = check(checkpoints, sealed.checkpoint_id, facts(native_references=native))
    assert verdict_name(settled.verdict) == "COMPATIBLE" and not settled.facts


# --- resume --------------------------------------------------------------------------------


def test_budgets_continue_across_a_resume_and_new_usage_adds(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest(provider="provider-a", model="model-a")).run_id
    put_budget(admin, budgets_pb2.RUN, run_id, 10_000)
    done = agent.gate.AuthorizeEffect(send(run_id, key(), usd=100))
    outcome = succeeded(done.attempt_id, "msg-1")
    outcome.succeeded.usage[USD] = 70
    agent.gate.RecordOutcome(outcome)
    waiting = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:carol@example.com", usd=200))
    assert outcome_name(waiting) == "ALLOW"
    record_usage(agent, run_id, 30, provider="provider-a", model="model-a", segment="segment-1")
    before = budget(agent, budgets_pb2.RUN, run_id)
    assert (before.posted, before.pending) == (100, 200)

    sealed = seal(checkpoints, agent, run_id)
    [copied] = json.loads(sealed.ledger_json)["budgets"]["budgets"]
    assert (copied["posted"], copied["pending"]) == (100, 200)
    register(checkpoints, sealed.checkpoint_id)
    resumed = resume(checkpoints, sealed.checkpoint_id, provider="provider-b", model="model-b")
    assert [e.effect_id for e in resumed.open_effects] == [waiting.effect_id]
    after = budget(agent, budgets_pb2.RUN, run_id)
    assert (after.posted, after.pending, after.limit) == (before.posted, before.pending, before.limit)

    # Usage of the new segment adds to the old; a provider or model switch refunds nothing.
    added = record_usage(agent, run_id, 40, provider="provider-b", model="model-b", segment="segment-2")
    assert [(b.posted, b.pending) for b in added.budgets if b.budget_id == before.budget_id] == [(140, 200)]
    # The reservation made before the resume is still held, and settles as it would have.
    agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=waiting.attempt_id, reason="not needed"))
    final = budget(agent, budgets_pb2.RUN, run_id)
    assert (final.posted, final.pending) == (140, 0)


def test_a_resume_restores_knowledge_not_permission(agent, admin, reviewer, checkpoints):
    admin.tools.PutToolContract(mail())
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    done = agent.gate.AuthorizeEffect(send(run_id, key()))
    assert outcome_name(done) == "ALLOW"
    agent.gate.RecordOutcome(succeeded(done.attempt_id, "msg-1"))
    wire_args, wire_target = b'{"amount":100,"to":"acct-1"}', "bank:acct-1"
    approval = request_approval(agent, run_id, wire_args, wire_target)
    decide(reviewer, approval.approval_id, True)

    sealed = seal(checkpoints, agent, run_id)
    ledger = json.loads(sealed.ledger_json)
    assert ledger["tools"][MAIL]["current"]["retired"] is False
    assert [a["approval_id"] for a in ledger["approvals"]["active"]] == [approval.approval_id]
    register(checkpoints, sealed.checkpoint_id)

    # After sealing: the tool is retired and the approval revoked.
    admin.tools.RetireTool(tools_pb2.RetireToolRequest(tool=MAIL, reason="provider deprecated"))
    reviewer.approvals.RevokeApproval(
        approvals_pb2.RevokeApprovalRequest(approval_id=approval.approval_id, reason="no longer")
    )

    resumed = resume(checkpoints, sealed.checkpoint_id)
    assert not resumed.open_effects and verdict_name(resumed.verdict.verdict) == "COMPATIBLE"
    retired = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:carol@example.com"))
    assert outcome_name(retired) == "DENY" and "TOOL_RETIRED" in codes(retired) and not retired.attempt_id
    wired = agent.gate.AuthorizeEffect(send(run_id, key(), wire_target, tool=WIRE, arguments=wire_args))
    assert wired.intent_digest == approval.intent_digest
    assert outcome_name(wired) == "REQUIRE_APPROVAL" and not wired.attempt_id and not wired.approval_id
    assert wired.approval_request_id != approval.approval_id
    kept = agent.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval.approval_id))
    assert approvals_pb2.ApprovalState.Name(kept.state) == "REVOKED" and not kept.consumed_by_attempt


def test_resume_appends_a_configuration_transition_and_increments_the_segment(agent, admin, checkpoints):
    run_id = agent.runs.CreateRun(
        runs_pb2.CreateRunRequest(provider="provider-a", model="model-a", adapter="adapter-a")
    ).run_id
    sealed = seal(checkpoints, agent, run_id)
    register(checkpoints, sealed.checkpoint_id)
    with raises_error("INVALID_ARGUMENT"):
        resume(checkpoints, sealed.checkpoint_id, context_digest="sha256:not-hex")
    with raises_error("INVALID_ARGUMENT"):
        resume(checkpoints, sealed.checkpoint_id, reason="")

    first = resume(
        checkpoints,
        sealed.checkpoint_id,
        provider="provider-b",
        model="model-b",
        adapter="adapter-b",
        reason="provider session lost",
        context_digest=CONTEXT_DIGEST,
    )
    assert first.run_id == run_id and first.segment == 2
    events = events_of(agent, run_id)
    transition = events[-1]
    assert (transition.type, transition.revision) == ("run.configuration_transition", first.revision)
    body = payload(transition)
    assert body["old"] == {"provider": "provider-a", "model": "model-a", "adapter": "adapter-a", "segment": 1}
    assert body["new"] == {"provider": "provider-b", "model": "model-b", "adapter": "adapter-b", "segment": 2}
    assert body["reason"] == "provider session lost"
    assert body["checkpoint_id"] == sealed.checkpoint_id
    assert body["context_manifest_digest"] == CONTEXT_DIGEST
    run = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    assert (run.segment, run.provider, run.model, run.adapter, run.revision) == (
        2,
        "provider-b",
        "model-b",
        "adapter-b",
        first.revision,
    )

    second = resume(
        checkpoints,
        sealed.checkpoint_id,
        provider="provider-c",
        model="model-c",
        adapter="adapter-c",
        reason="cheaper model",
    )
    assert second.segment == 3 and second.revision > first.revision
    body = payload(events_of(agent, run_id)[-1])
    assert body["old"] == {"provider": "provider-b", "model": "model-b", "adapter": "adapter-b", "segment": 2}
    assert body["new"]["segment"] == 3 and body["reason"] == "cheaper model"
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).segment == 3


def test_after_a_resume_only_read_only_tools_run_until_the_open_effects_are_settled(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    admin.tools.PutToolContract(
        contract(SEARCH, effect_class=common_pb2.READ_ONLY, provider_idempotency=False, lease_seconds=LEASE_SECONDS)
    )
    run_id = new_run(agent)
    waiting = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:carol@example.com"))
    lost = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:dave@example.com"))
    dispatch_unknown(agent, lost.attempt_id)
    before_resume = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:erin@example.com"))
    assert outcome_name(before_resume) == "ALLOW"  # no resume yet: no obligation
    agent.gate.RecordOutcome(succeeded(before_resume.attempt_id, "msg-erin"))

    sealed = seal(checkpoints, agent, run_id)
    register(checkpoints, sealed.checkpoint_id, facts(recorded_effects=[lost.effect_id]))
    resumed = resume(checkpoints, sealed.checkpoint_id, current=facts(recorded_effects=[lost.effect_id]))
    assert {(e.effect_id, e.stage) for e in resumed.open_effects} == {
        (waiting.effect_id, "AUTHORIZED"),
        (lost.effect_id, "UNKNOWN"),
    }

    def search() -> gate_pb2.AuthorizeEffectResponse:
        return agent.gate.AuthorizeEffect(
            send(run_id, key(), "https://search.example.com", tool=SEARCH, arguments=b'{"q":"x"}')
        )

    def fresh_mail() -> gate_pb2.AuthorizeEffectResponse:
        return agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:frank@example.com"))

    assert outcome_name(search()) == "ALLOW"
    refused = fresh_mail()
    assert outcome_name(refused) == "DENY" and codes(refused)[0] == "RECONCILE_AFTER_RESUME" and not refused.attempt_id
    assert waiting.effect_id in refused.reasons[0].message and lost.effect_id in refused.reasons[0].message

    agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=waiting.attempt_id, reason="will not send"))
    assert outcome_name(search()) == "ALLOW"
    still = fresh_mail()
    assert outcome_name(still) == "DENY" and codes(still)[0] == "RECONCILE_AFTER_RESUME"
    assert lost.effect_id in still.reasons[0].message and waiting.effect_id not in still.reasons[0].message

    agent.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=lost.effect_id, receipt=common_pb2.Receipt(provider_reference="msg-dave", detail_json=b"{}")
        )
    )
    allowed = fresh_mail()
    assert outcome_name(allowed) == "ALLOW" and "RECONCILE_AFTER_RESUME" not in codes(allowed)


# --- fork ----------------------------------------------------------------------------------


def test_a_live_fork_answers_duplicate_for_a_parents_succeeded_effect_and_creates_no_attempt(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    run_id = new_run(agent)
    done = agent.gate.AuthorizeEffect(send(run_id, "parent-key"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=done.attempt_id))
    agent.gate.RecordOutcome(succeeded(done.attempt_id, "msg-parent"))
    parent_effect = get_effect(agent, done.effect_id)
    sealed = seal(checkpoints, agent, run_id)
    register(checkpoints, sealed.checkpoint_id)

    child = fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.LIVE)
    assert child.parent_run_id == run_id and child.world == checkpoints_pb2.LIVE
    child_key = "child-key"
    for _ in range(2):
        again = agent.gate.AuthorizeEffect(send(child.run_id, child_key))
        assert outcome_name(again) == "DUPLICATE"
        assert again.effect_id == done.effect_id and again.intent_digest == done.intent_digest
        assert again.receipt.provider_reference == "msg-parent" and again.receipt.digest == parent_effect.receipt.digest
        assert stage_name(again.effect_stage) == "SUCCEEDED"
        assert not again.attempt_id and not again.provider_idempotency_key and not again.reservation_ids
        assert "EFFECT_SETTLED_IN_PARENT" in codes(again)

    assert [a.attempt_id for a in get_effect(agent, done.effect_id).attempts] == [done.attempt_id]
    assert not agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=child.run_id)).effects
    child_events = [e.type for e in events_of(agent, child.run_id)]
    assert "effect.authorized" not in child_events and "attempt.authorized" not in child_events
    # The DUPLICATE bound nothing: the child's key is still free for another intent.
    other = agent.gate.AuthorizeEffect(send(child.run_id, child_key, "mailto:carol@example.com"))
    assert outcome_name(other) == "ALLOW" and other.effect_id != done.effect_id
    assert get_effect(agent, other.effect_id).run_id == child.run_id


def test_a_fork_does_not_re_execute_a_parents_effect_after_the_tool_contract_changed(agent, admin, checkpoints):
    """The parent's effect is pinned to the revision it was authorized under; the child's request
    is judged against that revision, as a retry of the same key would be."""
    admin.tools.PutToolContract(mail())
    run_id = new_run(agent)
    done = agent.gate.AuthorizeEffect(send(run_id, key()))
    agent.gate.RecordOutcome(succeeded(done.attempt_id, "msg-parent"))
    lost = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:carol@example.com"))
    dispatch_unknown(agent, lost.attempt_id)
    sealed = seal(checkpoints, agent, run_id)
    register(checkpoints, sealed.checkpoint_id)
    admin.tools.PutToolContract(mail(max_attempts=5))  # revision 2: new effects pin it
    child = fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.LIVE)

    again = agent.gate.AuthorizeEffect(send(child.run_id, key()))
    assert outcome_name(again) == "DUPLICATE", (outcome_name(again), codes(again))
    assert again.effect_id == done.effect_id and again.receipt.provider_reference == "msg-parent"
    assert again.tool_revision == 1 and again.intent_digest == done.intent_digest and not again.attempt_id
    open_there = agent.gate.AuthorizeEffect(send(child.run_id, key(), "mailto:carol@example.com"))
    assert outcome_name(open_there) == "RECONCILE_REQUIRED", (outcome_name(open_there), codes(open_there))
    assert open_there.effect_id == lost.effect_id and not open_there.attempt_id
    assert [a.attempt_id for a in get_effect(agent, done.effect_id).attempts] == [done.attempt_id]
    assert [a.attempt_id for a in get_effect(agent, lost.effect_id).attempts] == [lost.attempt_id]
    assert not agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=child.run_id)).effects
    # A genuinely new intent in the child pins the current revision.
    fresh = agent.gate.AuthorizeEffect(send(child.run_id, key(), "mailto:dave@example.com"))
    assert outcome_name(fresh) == "ALLOW" and fresh.tool_revision == 2


def test_simulated_and_live_worlds_and_the_fork_trace(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    admin.tools.PutToolContract(simulator())
    run_id = new_run(agent)
    in_live = agent.gate.AuthorizeEffect(send(run_id, key(), tool=SANDBOX))
    assert outcome_name(in_live) == "DENY" and "SIMULATOR_IN_LIVE_WORLD" in codes(in_live)
    sealed = seal(checkpoints, agent, run_id)
    register(checkpoints, sealed.checkpoint_id)
    with raises_error("INVALID_ARGUMENT"):
        fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.WORLD_UNSPECIFIED)
    with raises_error("INVALID_ARGUMENT"):
        fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.SIMULATED, difference="")

    child = fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.SIMULATED, "model B instead of model A")
    assert child.world == checkpoints_pb2.SIMULATED and child.parent_run_id == run_id
    run = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=child.run_id))
    assert (run.world, run.parent_run_id, run.root_run_id, run.forked_from_checkpoint) == (
        "SIMULATED",
        run_id,
        run_id,
        sealed.checkpoint_id,
    )

    live_tool = agent.gate.AuthorizeEffect(send(child.run_id, key(), "mailto:carol@example.com"))
    assert outcome_name(live_tool) == "DENY" and "LIVE_TOOL_IN_SIMULATED_WORLD" in codes(live_tool)
    assert not live_tool.attempt_id
    simulated = agent.gate.AuthorizeEffect(send(child.run_id, key(), "mailto:carol@example.com", tool=SANDBOX))
    assert outcome_name(simulated) == "ALLOW" and simulated.attempt_id
    # The parent stays live: the simulator is still refused there.
    still_live = agent.gate.AuthorizeEffect(send(run_id, key(), "mailto:carol@example.com", tool=SANDBOX))
    assert outcome_name(still_live) == "DENY" and "SIMULATOR_IN_LIVE_WORLD" in codes(still_live)

    child_events = events_of(agent, child.run_id)
    assert (child_events[0].type, child_events[0].revision, child_events[0].prev_hash) == ("run.forked", 1, "")
    assert payload(child_events[0]) == {
        "parent_run_id": run_id,
        "checkpoint_id": sealed.checkpoint_id,
        "at_revision": sealed.revision,
        "world": "SIMULATED",
        "difference": "model B instead of model A",
    }
    created = [e for e in events_of(agent, run_id) if e.type == "run.fork_created"]
    assert len(created) == 1
    assert payload(created[0]) == {
        "child_run_id": child.run_id,
        "checkpoint_id": sealed.checkpoint_id,
        "world": "SIMULATED",
        "difference": "model B instead of model A",
    }


def test_run_tree_budgets_of_the_root_apply_to_a_forks_effects(agent, admin, checkpoints):
    admin.tools.PutToolContract(mail())
    root = new_run(agent)
    tree = put_budget(admin, budgets_pb2.RUN_TREE, root, 1_000)
    spent = agent.gate.AuthorizeEffect(send(root, key(), usd=300))
    assert outcome_name(spent) == "ALLOW"
    agent.gate.RecordOutcome(succeeded(spent.attempt_id, "msg-root"))
    sealed = seal(checkpoints, agent, root)
    register(checkpoints, sealed.checkpoint_id)
    child = fork(checkpoints, sealed.checkpoint_id, checkpoints_pb2.LIVE)
    grandchild_source = seal(checkpoints, agent, child.run_id)
    register(checkpoints, grandchild_source.checkpoint_id)
    grandchild = fork(checkpoints, grandchild_source.checkpoint_id, checkpoints_pb2.LIVE)
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=grandchild.run_id)).root_run_id == root
    assert [b["budget_id"] for b in json.loads(grandchild_source.ledger_json)["budgets"]["budgets"]] == [tree.budget_id]

    in_child = agent.gate.AuthorizeEffect(send(child.run_id, key(), "mailto:carol@example.com", usd=500))
    assert outcome_name(in_child) == "ALLOW" and len(in_child.reservation_ids) == 1
    view = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN_TREE, scope_id=root))
    [counted] = view.budgets
    assert (counted.posted, counted.pending, counted.available) == (300, 500, 200)
    assert [(r.reservation_id, r.effect_id) for r in view.open_reservations] == [
        (in_child.reservation_ids[0], in_child.effect_id)
    ]

    too_much = agent.gate.AuthorizeEffect(send(grandchild.run_id, key(), "mailto:dave@example.com", usd=300))
    assert outcome_name(too_much) == "DENY" and "BUDGET_EXHAUSTED" in codes(too_much)
    fits = agent.gate.AuthorizeEffect(send(grandchild.run_id, key(), "mailto:dave@example.com", usd=200))
    assert outcome_name(fits) == "ALLOW"
    final = budget(agent, budgets_pb2.RUN_TREE, root)
    assert (final.posted, final.pending, final.available) == (300, 700, 0)
