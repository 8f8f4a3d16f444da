"""Retention against the real server, on both backends (docs/retention.md).

Each backend gets a database of its own (created here), so ``effect-ledger verify`` walks only
what these tests wrote, and a server that accepts rules as short as one second
(``--retention-age-min-seconds 1``): a trace event's time is part of its hash, so its age can
only pass by waiting. Material that is not hash-chained (decisions, artifacts, snapshots) is
aged instead by setting its timestamp back in the database directly (``_age``), and the rule
for it is an hour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, update

from effect_ledger.errors import LedgerError
from effect_ledger.storage.engine import DatabaseSettings, create_sync
from effect_ledger.storage.schema import artifacts, decisions, run_events, schedules, snapshots, tombstones
from effectledger.v1 import checkpoints_pb2, common_pb2, gate_pb2, retention_pb2, runs_pb2
from support import (
    ServerProcess,
    authorize_request,
    contract,
    create_pg_database,
    drop_pg_database,
    migrate,
    new_run,
    new_tenant,
    outcome_name,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
HOUR = 3600
TRACE_AGE_SECONDS = 1


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def retention_server(request):
    if request.param == "postgres":
        url = create_pg_database("el_retention")
    else:
        url = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='el-retention-'), 'ledger.db')}"
    migrate(url)
    running = ServerProcess(url, ["--retention-age-min-seconds", "1"]).start()
    yield running
    running.stop()
    if request.param == "postgres":
        drop_pg_database(url)


@pytest.fixture
def tenant(retention_server):
    return new_tenant(retention_server.database_url)


@pytest.fixture
def clients(retention_server, tenant):
    made = {role: tenant.client(retention_server, role) for role in ("admin", "agent", "auditor")}
    made["admin"].tools.PutToolContract(contract(lease_seconds=3600))
    yield made
    for client in made.values():
        client.close()


def _rule(admin, kind: int, seconds: int) -> None:
    admin.retention.PutRetentionRule(retention_pb2.PutRetentionRuleRequest(kind=kind, max_age_seconds=seconds))


def _collect(admin, *, dry_run: bool = False) -> retention_pb2.CollectRetentionResponse:
    return admin.retention.CollectRetention(retention_pb2.CollectRetentionRequest(dry_run=dry_run))


def _settled_run(agent) -> tuple[str, gate_pb2.AuthorizeEffectResponse]:
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, f"{run_id}-settled"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    agent.gate.RecordOutcome(succeeded(allowed.attempt_id))
    return run_id, allowed


def _unknown_run(agent) -> tuple[str, gate_pb2.AuthorizeEffectResponse]:
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, f"{run_id}-unknown"))
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))
    return run_id, allowed


def _events(client, run_id: str) -> list:
    return list(client.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events)


def _age(url: str, table, column: str, tenant_id: str) -> None:
    """Set a tenant's rows of ``table`` back to 2000-01-01 (never a trace event: its time is hashed)."""
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.begin() as connection:
            connection.execute(update(table).where(table.c.tenant_id == tenant_id).values({column: LONG_AGO}))
    finally:
        engine.dispose()


def _execute(url: str, statement):
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.begin() as connection:
            result = connection.execute(statement)
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()


def _verify(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", "verify", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_with_an_unknown_effect_is_never_collected_and_reads_say_removed(retention_server, tenant, clients):
    admin, agent = clients["admin"], clients["agent"]
    _rule(admin, retention_pb2.TRACE, TRACE_AGE_SECONDS)
    _rule(admin, retention_pb2.DECISIONS, HOUR)
    settled_run, settled = _settled_run(agent)
    unknown_run, unknown_effect = _unknown_run(agent)
    before = {e.revision: e.hash for e in _events(agent, settled_run)}
    unknown_before = _events(agent, unknown_run)
    _age(retention_server.database_url, decisions, "created_at", tenant.name)
    time.sleep(TRACE_AGE_SECONDS + 0.2)

    collected = _collect(admin)

    assert collected.decisions == 1, "the settled run's one decision; never the UNKNOWN run's"
    assert collected.trace_events == len(before)
    assert collected.tombstones_written == collected.decisions + collected.trace_events
    assert not collected.more
    # The run with an UNKNOWN effect: every event and its decision as they were.
    assert _events(agent, unknown_run) == unknown_before
    assert agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=unknown_effect.decision_id)).input_json
    # The settled run: each event keeps its place and hash, says it was removed, and by what.
    removed = _events(agent, settled_run)
    assert {e.revision: e.hash for e in removed} == before
    for event in removed:
        assert event.HasField("removed_by_retention")
        tombstone = event.removed_by_retention
        assert retention_pb2.RetentionKind.Name(tombstone.kind) == "TRACE"
        assert tombstone.subject == f"{settled_run}:{event.revision}"
        assert tombstone.rule_max_age_seconds == TRACE_AGE_SECONDS and tombstone.removed_by == "admin"
        marker = json.loads(event.payload_json)["removed_by_retention"]
        assert marker == {"tombstone_id": tombstone.tombstone_id, "payload_digest": tombstone.material_digest}
    # A removed decision is NOT_FOUND with a reason that says so, never an empty decision.
    with raises_error("NOT_FOUND", "REMOVED_BY_RETENTION"):
        agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=settled.decision_id))
    metadata = raises_error.last.metadata
    assert metadata["kind"] == "DECISIONS" and metadata["rule_max_age_seconds"] == str(HOUR)
    assert metadata["subject"] == settled.decision_id and metadata["removed_at"]
    with raises_error("NOT_FOUND", "REMOVED_BY_RETENTION"):
        admin.gate.ReplayDecision(gate_pb2.ReplayDecisionRequest(decision_id=settled.decision_id))
    with raises_error("NOT_FOUND", "DECISION_NOT_FOUND"):
        agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id="dec_never_was"))
    # Effects, attempts and receipts are never collected.
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=settled.effect_id))
    assert stage_name(effect.stage) == "SUCCEEDED" and len(effect.attempts) == 1
    assert effect.receipt.provider_reference == "provider-ref-1"
    # Collecting again finds nothing: removed material no longer matches.
    again = _collect(admin)
    assert (again.trace_events, again.decisions, again.tombstones_written) == (0, 0, 0)


def test_a_held_run_is_never_collected_and_is_after_release(retention_server, tenant, clients):
    admin, agent, auditor = clients["admin"], clients["agent"], clients["auditor"]
    _rule(admin, retention_pb2.TRACE, TRACE_AGE_SECONDS)
    run_id, _ = _settled_run(agent)
    hold = auditor.retention.PlaceLegalHold(retention_pb2.PlaceLegalHoldRequest(run_id=run_id, reason="case 42"))
    assert (hold.placed_by, hold.reason, hold.released_by) == ("auditor", "case 42", "")
    time.sleep(TRACE_AGE_SECONDS + 0.2)

    assert _collect(admin).trace_events == 0
    assert not any(e.HasField("removed_by_retention") for e in _events(agent, run_id))
    assert _events(agent, run_id)[-1].type == "retention.hold_placed"

    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        auditor.retention.ReleaseLegalHold(retention_pb2.ReleaseLegalHoldRequest(run_id=run_id))
    released = admin.retention.ReleaseLegalHold(retention_pb2.ReleaseLegalHoldRequest(run_id=run_id))
    assert released.released_by == "admin" and released.HasField("released_at")
    listed = admin.retention.ListLegalHolds(retention_pb2.ListLegalHoldsRequest(include_released=True)).holds
    assert [(h.run_id, h.released_by) for h in listed] == [(run_id, "admin")]
    assert not admin.retention.ListLegalHolds(retention_pb2.ListLegalHoldsRequest()).holds

    collected = _collect(admin)
    events = _events(agent, run_id)
    assert collected.trace_events == len(events) - 1, "everything but the release, which is too young"
    assert [e.HasField("removed_by_retention") for e in events] == [True] * (len(events) - 1) + [False]
    assert events[-1].type == "retention.hold_released"
    with raises_error("NOT_FOUND", "LEGAL_HOLD_NOT_FOUND"):
        admin.retention.ReleaseLegalHold(retention_pb2.ReleaseLegalHoldRequest(run_id=new_run(agent)))


def test_verify_passes_after_collection_and_tells_a_tombstone_from_tampering(retention_server, tenant, clients):
    url = retention_server.database_url
    admin, agent = clients["admin"], clients["agent"]
    _rule(admin, retention_pb2.TRACE, TRACE_AGE_SECONDS)
    run_id, _ = _settled_run(agent)
    time.sleep(TRACE_AGE_SECONDS + 0.2)
    assert _collect(admin).trace_events >= 3

    verified = _verify(url)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"run {run_id}: " in verified.stdout and "removed by retention" in verified.stdout

    first = _events(agent, run_id)[0]
    tombstone_id = first.removed_by_retention.tombstone_id
    where_tombstone = (tombstones.c.tenant_id == tenant.name, tombstones.c.tombstone_id == tombstone_id)
    where_event = (
        run_events.c.tenant_id == tenant.name,
        run_events.c.run_id == run_id,
        run_events.c.revision == first.revision,
    )
    # A tombstone whose recorded hash is not the event's: tampered.
    _execute(url, update(tombstones).where(*where_tombstone).values(event_hash="0" * 64))
    try:
        broken = _verify(url)
        assert broken.returncode == 1 and f"run {run_id} revision 1: " in broken.stdout
        assert "another hash" in broken.stdout and "tampered" in broken.stdout
    finally:
        _execute(url, update(tombstones).where(*where_tombstone).values(event_hash=first.hash))
    # A marker naming no tombstone (an edit dressed up as a removal): tampered.
    original = _execute(url, select(run_events.c.payload).where(*where_event))[0][0]
    forged = original.replace(tombstone_id, "tmb_forged")
    _execute(url, update(run_events).where(*where_event).values(payload=forged))
    try:
        broken = _verify(url)
        assert broken.returncode == 1 and "has no tombstone" in broken.stdout
    finally:
        _execute(url, update(run_events).where(*where_event).values(payload=original))
    # A tombstone row removed: its event is an edit again.
    saved = _execute(url, select(tombstones).where(*where_tombstone))[0]._asdict()
    _execute(url, tombstones.delete().where(*where_tombstone))
    try:
        assert "has no tombstone" in _verify(url).stdout
    finally:
        _execute(url, tombstones.insert().values(**saved))
    assert _verify(url).returncode == 0


def _seal_and_register(agent, run_id: str, references) -> checkpoints_pb2.Checkpoint:
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = agent.checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id,
            expected_revision=revision,
            state_json=b'{"step":1}',
            artifacts=references,
            facts=checkpoints_pb2.CompatibilityFacts(runtime="agent-runtime/3", checkpoint_format=2),
        )
    )
    agent.checkpoints.RegisterCheckpoint(checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    return sealed


def _put(agent, content: bytes) -> str:
    put = agent.checkpoints.PutArtifact(checkpoints_pb2.PutArtifactRequest(content=content, media_type="text/plain"))
    return put.digest


def test_a_collected_optional_artifact_degrades_resume_and_retained_runs_keep_theirs(retention_server, tenant, clients):
    url = retention_server.database_url
    admin, agent, auditor = clients["admin"], clients["agent"], clients["auditor"]
    _rule(admin, retention_pb2.ARTIFACTS, HOUR)
    notes = _put(agent, b"raw provider payload " + tenant.name.encode())
    kept_by_hold = _put(agent, b"evidence " + tenant.name.encode())
    run_id, held_run = new_run(agent), new_run(agent)
    checkpoint = _seal_and_register(
        agent, run_id, [checkpoints_pb2.ArtifactRef(name="notes.txt", digest=notes, classification=2)]
    )
    _seal_and_register(
        agent, held_run, [checkpoints_pb2.ArtifactRef(name="evidence.txt", digest=kept_by_hold, classification=2)]
    )
    auditor.retention.PlaceLegalHold(retention_pb2.PlaceLegalHoldRequest(run_id=held_run, reason="audit"))
    current = checkpoints_pb2.CompatibilityFacts(runtime="agent-runtime/3", checkpoint_format=2)
    check = checkpoints_pb2.CheckResumeCompatibilityRequest(checkpoint_id=checkpoint.checkpoint_id, current=current)
    assert checkpoints_pb2.Verdict.Name(agent.checkpoints.CheckResumeCompatibility(check).verdict) == "COMPATIBLE"
    # Aged directly in the database (an artifact is not hash-chained): older than the hour's rule.
    _age(url, artifacts, "updated_at", tenant.name)

    collected = _collect(admin)

    assert collected.artifacts == 1, "notes only: the held run's checkpoint reaches its artifact"
    verdict = agent.checkpoints.CheckResumeCompatibility(check)
    assert checkpoints_pb2.Verdict.Name(verdict.verdict) == "DEGRADED"
    assert [(f.fact, f.degraded_only) for f in verdict.facts] == [("artifact:notes.txt", True)]
    assert "removed by retention" in verdict.facts[0].reason
    rows = _execute(url, select(artifacts.c.digest, artifacts.c.status).where(artifacts.c.tenant_id == tenant.name))
    assert dict(rows) == {notes: "TOMBSTONE", kept_by_hold: "COMPLETE"}
    with raises_error("FAILED_PRECONDITION", "ARTIFACT_DELETED"):
        agent.checkpoints.CompleteArtifact(checkpoints_pb2.CompleteArtifactRequest(digest=notes))
    assert raises_error.last.metadata["removed_by_retention"].startswith("removed by retention at ")


def test_snapshots_dry_run_rules_and_the_command_line(retention_server, tenant, clients):
    url = retention_server.database_url
    admin, agent = clients["admin"], clients["agent"]
    with raises_error("INVALID_ARGUMENT", "INVALID_MAX_AGE"):
        _rule(admin, retention_pb2.SNAPSHOTS, -5)
    with raises_error("INVALID_ARGUMENT", "FIELD_REQUIRED"):
        _rule(admin, retention_pb2.RETENTION_KIND_UNSPECIFIED, HOUR)
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        _rule(agent, retention_pb2.SNAPSHOTS, HOUR)
    _rule(admin, retention_pb2.SNAPSHOTS, HOUR)
    _rule(admin, retention_pb2.DECISIONS, HOUR)
    _rule(admin, retention_pb2.DECISIONS, 0)  # removed: decisions are kept forever again
    listed = agent.retention.ListRetentionRules(retention_pb2.ListRetentionRulesRequest()).rules
    assert [(retention_pb2.RetentionKind.Name(r.kind), r.max_age_seconds, r.updated_by) for r in listed] == [
        ("SNAPSHOTS", HOUR, "admin")
    ]
    run_id, _ = _settled_run(agent)
    snapshot = agent.checkpoints.RecordSnapshot(checkpoints_pb2.RecordSnapshotRequest(run_id=run_id, value_json=b"[1]"))
    _age(url, snapshots, "created_at", tenant.name)
    _age(url, decisions, "created_at", tenant.name)

    dry = _collect(admin, dry_run=True)
    assert (dry.snapshots, dry.decisions, dry.tombstones_written) == (1, 0, 0)
    listing = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "collect", "--database-url", url, "--tenant", tenant.name, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(listing.stdout) == {
        "dry_run": True,
        "trace": 0,
        "decisions": 0,
        "artifacts": 0,
        "snapshots": 1,
        "tombstones_written": 0,
        "more": 0,
    }
    where = (snapshots.c.tenant_id == tenant.name, snapshots.c.snapshot_id == snapshot.snapshot_id)
    assert _execute(url, select(snapshots.c.snapshot_id).where(*where)), "a dry run removes nothing"

    done = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "collect", "--database-url", url, "--tenant", tenant.name],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout)["snapshots"] == 1 and json.loads(done.stdout)["tombstones_written"] == 1
    assert not _execute(url, select(snapshots.c.snapshot_id).where(*where))
    left = _execute(
        url,
        select(tombstones.c.kind, tombstones.c.removed_by, tombstones.c.material_digest).where(
            tombstones.c.tenant_id == tenant.name, tombstones.c.subject == snapshot.snapshot_id
        ),
    )
    assert [(kind, by) for kind, by, _ in left] == [("SNAPSHOTS", "collector")]
    assert left[0][2].startswith("sha256:")


def test_a_pending_approval_or_an_open_schedule_keeps_a_run(retention_server, tenant, clients):
    url = retention_server.database_url
    admin, agent = clients["admin"], clients["agent"]
    admin.tools.PutToolContract(
        contract("payment.wire", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
    )
    _rule(admin, retention_pb2.DECISIONS, HOUR)
    waiting = new_run(agent)
    asked = agent.gate.AuthorizeEffect(authorize_request(waiting, "wire-1", tool="payment.wire", target="bank:1"))
    assert outcome_name(asked) == "REQUIRE_APPROVAL"
    scheduled, _ = _settled_run(agent)
    # An open schedule, written directly (its intent is never due: not before 2100).
    _execute(
        url,
        schedules.insert().values(
            tenant_id=tenant.name,
            schedule_id=f"sch_{scheduled}",
            run_id=scheduled,
            idempotency_key=f"{scheduled}-later",
            tool="email.send",
            tool_revision=1,
            target="mailto:bob@example.com",
            arguments="{}",
            intent_digest="0" * 64,
            purpose="DELAYED_RETRY",
            not_before=datetime(2100, 1, 1, tzinfo=UTC),
            cancel_conditions="[]",
            reservation="{}",
            state="SCHEDULED",
            note="",
            created_by="agent",
            created_at=datetime.now(UTC),
            closed_by="",
            close_reason="",
        ),
    )
    finished, finished_effect = _settled_run(agent)
    _age(url, decisions, "created_at", tenant.name)

    collected = _collect(admin)

    assert collected.decisions == 1, "only the finished run's decision"
    with raises_error("NOT_FOUND", "REMOVED_BY_RETENTION"):
        agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=finished_effect.decision_id))
    assert agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=asked.decision_id)).decision_id
    kept = agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest(run_id=scheduled)).decisions
    assert len(kept) == 1 and finished != scheduled


def test_the_periodic_collector_runs_every_tenant_with_a_rule(retention_server, tenant, clients):
    admin, agent = clients["admin"], clients["agent"]
    _rule(admin, retention_pb2.DECISIONS, HOUR)
    _run, settled = _settled_run(agent)
    _age(retention_server.database_url, decisions, "created_at", tenant.name)
    periodic = ServerProcess(retention_server.database_url, ["--retention-interval-seconds", "0.2"]).start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=settled.decision_id))
            except LedgerError as error:
                assert error.reason == "REMOVED_BY_RETENTION"
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the periodic collector never collected the decision")
        metadata = raises_error_metadata(agent, settled.decision_id)
        assert metadata["kind"] == "DECISIONS"
    finally:
        periodic.stop()
    removed_by = _execute(
        retention_server.database_url,
        select(tombstones.c.removed_by).where(
            tombstones.c.tenant_id == tenant.name, tombstones.c.subject == settled.decision_id
        ),
    )
    assert [row[0] for row in removed_by] == ["collector"]


def raises_error_metadata(agent, decision_id: str) -> dict[str, str]:
    with raises_error("NOT_FOUND", "REMOVED_BY_RETENTION"):
        agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id))
    return raises_error.last.metadata
