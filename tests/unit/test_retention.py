"""Retention's pure rules (domain/retention.py) and the chain walk over collected events
(domain/trace.py): what keeps a run, rule bounds, markers, and a tombstone told from an edit."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from effect_ledger.domain import retention
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.retention import Kind, Rule, RunFacts, Tombstone
from effect_ledger.domain.trace import GENESIS_HASH, event_hash, walk_chain
from effect_ledger.errors import InvalidArgument

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TENANT, RUN = "acme", "run_1"


def build_chain(length: int = 5) -> list[dict]:
    events, previous = [], GENESIS_HASH
    for revision in range(1, length + 1):
        event = {
            "revision": revision,
            "type": "attempt.succeeded",
            "payload": {"attempt_id": f"att_{revision}", "receipt": {"ref": f"msg-{revision}"}},
            "principal_id": "agent-1",
            "created_at": NOW + timedelta(milliseconds=revision),
            "prev_hash": previous,
        }
        event["hash"] = event_hash(
            prev_hash=previous,
            tenant_id=TENANT,
            run_id=RUN,
            revision=revision,
            event_type=event["type"],
            payload=event["payload"],
            principal_id=event["principal_id"],
            created_at=event["created_at"],
        )
        events.append(event)
        previous = event["hash"]
    return events


# --- what keeps a run ---------------------------------------------------------------------------


def test_a_run_with_nothing_open_is_not_retained():
    assert retention.retained_because(RunFacts()) == ()


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (RunFacts(legal_hold=True), "legal hold"),
        (RunFacts(open_effects=1), "open or UNKNOWN effects"),
        (RunFacts(open_schedules=2), "open schedules"),
        (RunFacts(pending_approvals=1), "pending approvals"),
    ],
)
def test_each_open_thing_retains_the_run_on_its_own(facts, reason):
    assert retention.retained_because(facts) == (reason,)


def test_every_reason_is_named():
    facts = RunFacts(legal_hold=True, open_effects=3, open_schedules=1, pending_approvals=1)
    assert len(retention.retained_because(facts)) == 4


# --- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0, 3600, retention.AGE_MAX_SECONDS])
def test_rule_ages_within_bounds_or_zero_are_accepted(seconds):
    retention.check_max_age(seconds, retention.AGE_MIN_SECONDS_DEFAULT)


@pytest.mark.parametrize("seconds", [-1, 1, 3599, retention.AGE_MAX_SECONDS + 1])
def test_rule_ages_outside_bounds_are_refused(seconds):
    with pytest.raises(InvalidArgument) as refused:
        retention.check_max_age(seconds, retention.AGE_MIN_SECONDS_DEFAULT)
    assert refused.value.reason == "INVALID_MAX_AGE"
    assert refused.value.violations[0].field == "max_age_seconds"


def test_a_lower_floor_accepts_short_rules():
    retention.check_max_age(1, 1)


def test_the_cutoff_is_the_rule_age_before_now():
    rule = Rule(Kind.TRACE, 400 * 86_400, "admin", NOW)
    assert retention.cutoff(NOW, rule) == NOW - timedelta(days=400)


def test_referenced_digests_reads_a_checkpoint_artifacts_column():
    column = '[{"classification":"OPTIONAL","digest":"sha256:aa","name":"a"},{"digest":"sha256:bb","name":"b"}]'
    assert retention.referenced_digests(column) == {"sha256:aa", "sha256:bb"}
    assert retention.referenced_digests("not json") == set()
    assert retention.referenced_digests('{"digest":"sha256:aa"}') == set()
    assert retention.referenced_digests('[{"digest":1},"x"]') == set()


# --- markers --------------------------------------------------------------------------------------


def test_a_marker_is_recognised_only_in_its_exact_shape():
    marker = retention.trace_marker("tmb_1", "sha256:ab")
    assert retention.marker_of(marker) == ("tmb_1", "sha256:ab")
    assert retention.marker_of({**marker, "other": 1}) is None
    assert retention.marker_of({"removed_by_retention": {"tombstone_id": "tmb_1"}}) is None
    assert retention.marker_of({"removed_by_retention": {"tombstone_id": 1, "payload_digest": "x"}}) is None
    assert retention.marker_of({"effect_id": "eff_1"}) is None
    assert retention.marker_of("removed_by_retention") is None


def test_removed_metadata_says_what_when_and_under_which_rule():
    tombstone = _tombstone("tmb_1", "run_1:1", "sha256:aa", "ff")
    metadata = retention.removed_metadata(tombstone)
    assert metadata["kind"] == "TRACE" and metadata["rule_max_age_seconds"] == "60"
    assert metadata["removed_at"] == NOW.isoformat() and metadata["tombstone_id"] == "tmb_1"


def test_counts_add_up():
    total = retention.Counts.zero()
    batch = retention.Counts.zero()
    batch.removed[Kind.DECISIONS] = 1000
    batch.tombstones_written = 1000
    total.add(batch)
    total.add(batch)
    assert total.removed[Kind.DECISIONS] == 2000 and total.tombstones_written == 2000 and not total.more


# --- the chain walk over collected events --------------------------------------------------------


def _tombstone(tombstone_id: str, subject: str, digest: str, event_hash: str) -> Tombstone:
    return Tombstone(tombstone_id, Kind.TRACE, subject, RUN, digest, event_hash, 60, NOW, "collector")


def _collect(events: list[dict], revisions: list[int]) -> dict[str, Tombstone]:
    """What the collector does to ``revisions``: marker in, tombstone out."""
    found = {}
    for event in events:
        if event["revision"] in revisions:
            tombstone_id = f"tmb_{event['revision']}"
            digest = retention.material_digest(canonical_bytes(event["payload"]))
            found[tombstone_id] = _tombstone(
                tombstone_id, retention.trace_subject(RUN, event["revision"]), digest, event["hash"]
            )
            event["payload"] = retention.trace_marker(tombstone_id, digest)
    return found


def _walk(events: list[dict], tombstones: dict[str, Tombstone]):
    return walk_chain(TENANT, RUN, events, len(events), events[-1]["hash"], tombstones)


def test_collected_events_pass_and_are_counted():
    events = build_chain()
    tombstones = _collect(events, [1, 2, 5])
    walked = _walk(events, tombstones)
    assert walked.chain_break is None and walked.removed_by_retention == 3


def test_a_marker_without_its_tombstone_is_an_edit():
    events = build_chain()
    tombstones = _collect(events, [2])
    walked = _walk(events, {})
    assert walked.chain_break is not None and walked.chain_break.revision == 2
    assert "has no tombstone" in walked.chain_break.problem
    del tombstones


def test_a_tombstone_with_another_hash_is_tampering():
    events = build_chain()
    tombstones = _collect(events, [3])
    forged = {k: Tombstone(**{**v.__dict__, "event_hash": "0" * 64}) for k, v in tombstones.items()}
    walked = _walk(events, forged)
    assert walked.chain_break.revision == 3 and "another hash" in walked.chain_break.problem


def test_a_tombstone_of_another_event_does_not_vouch():
    events = build_chain()
    tombstones = _collect(events, [3])
    moved = {k: Tombstone(**{**v.__dict__, "subject": f"{RUN}:4"}) for k, v in tombstones.items()}
    assert "not this event" in _walk(events, moved).chain_break.problem


def test_a_marker_with_another_digest_is_tampering():
    events = build_chain()
    tombstones = _collect(events, [3])
    events[2]["payload"] = retention.trace_marker("tmb_3", "sha256:" + "1" * 64)
    assert "payload digest" in _walk(events, tombstones).chain_break.problem


def test_an_edit_of_an_event_that_was_not_collected_is_still_found():
    events = build_chain()
    tombstones = _collect(events, [1])
    events[3]["payload"] = {"attempt_id": "att_4", "receipt": {"ref": "msg-43"}}
    walked = _walk(events, tombstones)
    assert walked.chain_break.revision == 4 and "edited" in walked.chain_break.problem


def test_a_collected_event_whose_hash_was_changed_breaks_the_link():
    events = build_chain()
    tombstones = _collect(events, [2])
    events[1]["hash"] = "0" * 64
    forged = {k: Tombstone(**{**v.__dict__, "event_hash": "0" * 64}) for k, v in tombstones.items()}
    walked = _walk(copy.deepcopy(events[:-1]) + [events[-1]], forged)
    assert walked.chain_break.revision == 3 and "prev_hash" in walked.chain_break.problem


# --- the console's client-side check -------------------------------------------------------------


def test_the_console_tells_a_collected_event_from_an_edit():
    from effect_ledger_client.console import chain

    server_events = build_chain(3)
    tombstones = _collect(server_events, [2])
    events = [
        chain.ChainEvent(
            e["revision"],
            e["type"],
            canonical_bytes(e["payload"]),
            e["principal_id"],
            e["created_at"],
            e["prev_hash"],
            e["hash"],
            removed_tombstone_id="tmb_2" if e["revision"] == 2 else "",
        )
        for e in server_events
    ]
    arguments = {"run_id": RUN, "head_revision": 3, "head_hash": events[-1].hash, "tenant_id": TENANT}
    verdict = chain.verify_chain(events, **arguments)
    assert verdict.status == chain.VERIFIED and "1 whose payload retention removed" in verdict.detail
    unnamed = [*events[:1], replace(events[1], removed_tombstone_id=""), *events[2:]]
    assert chain.verify_chain(unnamed, **arguments).status == chain.BROKEN
    other = [*events[:1], replace(events[1], removed_tombstone_id="tmb_other"), *events[2:]]
    assert chain.verify_chain(other, **arguments).broken_at_revision == 2
    assert tombstones


def test_the_retaining_states_are_the_ledgers_own():
    from effect_ledger.domain.approvals import ApprovalState
    from effect_ledger.domain.model import OPEN_STAGES

    assert set(retention.OPEN_EFFECT_STAGES) == {stage.value for stage in OPEN_STAGES}
    assert set(retention.UNRESOLVED_APPROVAL_STATES) <= {state.value for state in ApprovalState}
    assert {"PENDING", "APPROVED"} == set(retention.UNRESOLVED_APPROVAL_STATES)
    from effect_ledger.storage.schema import OPEN_SCHEDULE

    listed = ", ".join(f"'{state}'" for state in retention.OPEN_SCHEDULE_STATES)
    assert f"state IN ({listed})" == OPEN_SCHEDULE
