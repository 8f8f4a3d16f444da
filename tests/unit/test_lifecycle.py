"""The lifecycle of effects and attempts (domain/lifecycle.py): edges, reports, verdicts."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from effect_ledger.domain.canonical import receipt_digest
from effect_ledger.domain.lifecycle import (
    ALLOWED_EDGES,
    Report,
    ReportKind,
    VerdictKind,
    apply_report,
    counted_attempts,
    edge_allowed,
    effect_stage,
    lease_expired,
    lease_until,
    ledger_verdict,
    not_happened_settles_after,
    provider_key_for_new_attempt,
    reconcile,
)
from effect_ledger.domain.model import (
    Attempt,
    Effect,
    EffectClass,
    FailureEvidence,
    Receipt,
    Recovery,
    Stage,
    ToolContract,
)

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DIGEST = "d" * 64
TERMINAL = {Stage.SUCCEEDED, Stage.FAILED, Stage.RELEASED}


def make_receipt(reference: str) -> Receipt:
    detail = {"status": "sent"}
    return Receipt(reference, detail, receipt_digest(provider_reference=reference, detail=detail))


RECEIPT = make_receipt("msg-1")
OTHER_RECEIPT = make_receipt("msg-2")


def make_attempt(
    stage: Stage,
    number: int = 1,
    *,
    provider_key: str | None = None,
    receipt: Receipt | None = None,
    lease_expires_at: datetime = T0 + timedelta(seconds=60),
) -> Attempt:
    if receipt is None and stage == Stage.SUCCEEDED:
        receipt = RECEIPT
    return Attempt(
        attempt_id=f"att_{number}",
        effect_id="eff_1",
        number=number,
        stage=stage,
        provider_key=provider_key or f"eff_1.{number}",
        provider_key_reused=False,
        lease_expires_at=lease_expires_at,
        authorized_at=T0,
        decision_id=f"dec_{number}",
        receipt=receipt,
    )


def make_effect(attempts: list[Attempt], digest: str = DIGEST) -> Effect:
    return Effect(
        effect_id="eff_1",
        run_id="run_1",
        tool="email.send",
        tool_revision=1,
        target="mailto:bob@example.com",
        idempotency_key="k1",
        intent_digest=digest,
        arguments={"to": "bob"},
        stage=effect_stage(attempts),
        created_at=T0,
        updated_at=T0,
        attempts=attempts,
    )


def make_contract(*, max_attempts: int = 3, recovery: tuple[Recovery, ...] = ()) -> ToolContract:
    return ToolContract(
        tool="email.send",
        revision=1,
        effect_class=EffectClass.RETRYABLE_WITH_KEY,
        provider_idempotency=True,
        queryable=True,
        allowed_recovery=recovery,
        arguments_schema=None,
        max_attempts=max_attempts,
        lease_seconds=60,
    )


SAME_KEY = (Recovery.RETRY_SAME_KEY,)


# --- the edge table ------------------------------------------------------------------------------

EXPECTED_EDGES = {
    (Stage.AUTHORIZED, Stage.DISPATCHED),
    (Stage.AUTHORIZED, Stage.RELEASED),
    (Stage.AUTHORIZED, Stage.SUCCEEDED),
    (Stage.AUTHORIZED, Stage.FAILED),
    (Stage.AUTHORIZED, Stage.UNKNOWN),
    (Stage.DISPATCHED, Stage.SUCCEEDED),
    (Stage.DISPATCHED, Stage.FAILED),
    (Stage.DISPATCHED, Stage.UNKNOWN),
    (Stage.UNKNOWN, Stage.SUCCEEDED),
    (Stage.UNKNOWN, Stage.FAILED),
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(Stage, Stage)))
def test_edge_allowed_exactly_per_the_table(source, target):
    assert edge_allowed(source, target) == ((source, target) in EXPECTED_EDGES)


def test_the_edge_table_covers_every_stage_and_terminal_stages_are_final():
    assert set(ALLOWED_EDGES) == set(Stage)
    assert all(not ALLOWED_EDGES[stage] for stage in TERMINAL)


# --- apply_report, every stage against every report -----------------------------------------------

APPLIED, IGNORED = "applied", "ignored"

REPORTS = {
    "dispatched": Report(ReportKind.DISPATCHED),
    "released": Report(ReportKind.RELEASED, "not needed"),
    "succeeded same receipt": Report(ReportKind.SUCCEEDED, receipt=RECEIPT),
    "succeeded other receipt": Report(ReportKind.SUCCEEDED, receipt=OTHER_RECEIPT),
    "failed not sent": Report(ReportKind.FAILED, "x", failure_evidence=FailureEvidence.NOT_SENT),
    "failed rejected": Report(ReportKind.FAILED, "x", failure_evidence=FailureEvidence.PROVIDER_REJECTED),
    "unknown": Report(ReportKind.UNKNOWN, "connection reset"),
}

# (stage, report) -> APPLIED (moves to the report's stage), IGNORED (an echo or weaker report), or
# the reason it is refused. An attempt SUCCEEDED holds RECEIPT.
REPORT_TABLE = {
    Stage.AUTHORIZED: {
        "dispatched": APPLIED,
        "released": APPLIED,
        "succeeded same receipt": APPLIED,
        "succeeded other receipt": APPLIED,
        "failed not sent": APPLIED,
        "failed rejected": APPLIED,
        "unknown": APPLIED,
    },
    Stage.DISPATCHED: {
        "dispatched": IGNORED,
        "released": "ATTEMPT_NOT_RELEASABLE",
        "succeeded same receipt": APPLIED,
        "succeeded other receipt": APPLIED,
        "failed not sent": "DISPATCH_RECORDED",
        "failed rejected": APPLIED,
        "unknown": APPLIED,
    },
    Stage.UNKNOWN: {
        "dispatched": "ATTEMPT_NOT_OPEN",  # reported UNKNOWN by its runtime (its lease still runs)
        "released": "ATTEMPT_NOT_RELEASABLE",
        "succeeded same receipt": "RECONCILE_REQUIRED",
        "succeeded other receipt": "RECONCILE_REQUIRED",
        "failed not sent": "RECONCILE_REQUIRED",
        "failed rejected": "RECONCILE_REQUIRED",
        "unknown": IGNORED,
    },
    Stage.SUCCEEDED: {
        "dispatched": IGNORED,
        "released": "ATTEMPT_NOT_RELEASABLE",
        "succeeded same receipt": IGNORED,
        "succeeded other receipt": "CONFLICTING_OUTCOME",
        "failed not sent": "CONFLICTING_OUTCOME",
        "failed rejected": "CONFLICTING_OUTCOME",
        "unknown": IGNORED,
    },
    Stage.FAILED: {
        "dispatched": "ATTEMPT_SETTLED",
        "released": "ATTEMPT_NOT_RELEASABLE",
        "succeeded same receipt": "CONFLICTING_OUTCOME",
        "succeeded other receipt": "CONFLICTING_OUTCOME",
        "failed not sent": IGNORED,
        "failed rejected": IGNORED,
        "unknown": IGNORED,
    },
    Stage.RELEASED: {
        "dispatched": "ATTEMPT_RELEASED",
        "released": IGNORED,
        "succeeded same receipt": "ATTEMPT_RELEASED",
        "succeeded other receipt": "ATTEMPT_RELEASED",
        "failed not sent": IGNORED,
        "failed rejected": "ATTEMPT_RELEASED",
        "unknown": "ATTEMPT_RELEASED",
    },
}


def test_the_report_table_covers_every_stage_and_report():
    assert set(REPORT_TABLE) == set(Stage)
    assert all(set(row) == set(REPORTS) for row in REPORT_TABLE.values())
    assert {report.kind for report in REPORTS.values()} == set(ReportKind)


@pytest.mark.parametrize(
    ("stage", "label"),
    [(stage, label) for stage in Stage for label in REPORTS],
    ids=lambda v: str(v),
)
def test_apply_report(stage, label):
    report = REPORTS[label]
    expected = REPORT_TABLE[stage][label]
    transition = apply_report(make_attempt(stage), report, T0)
    if expected == APPLIED:
        assert transition.applied and not transition.refused
        assert transition.stage == Stage(report.kind.value)
        assert edge_allowed(stage, transition.stage)
    elif expected == IGNORED:
        assert not transition.applied and not transition.refused
        assert transition.stage == stage
    else:
        assert not transition.applied
        assert transition.refused and transition.refused_reason == expected
        assert transition.refused_message
        assert transition.stage == stage


def test_a_succeeded_report_without_a_receipt_conflicts_with_a_recorded_success():
    transition = apply_report(make_attempt(Stage.SUCCEEDED), Report(ReportKind.SUCCEEDED), T0)
    assert transition.refused_reason == "CONFLICTING_OUTCOME"


def test_a_failure_without_evidence_on_a_dispatched_attempt_is_applied():
    transition = apply_report(make_attempt(Stage.DISPATCHED), Report(ReportKind.FAILED, "x"), T0)
    assert transition.applied and transition.stage == Stage.FAILED


def test_a_failure_without_evidence_on_a_released_attempt_is_refused():
    transition = apply_report(make_attempt(Stage.RELEASED), Report(ReportKind.FAILED, "x"), T0)
    assert transition.refused_reason == "ATTEMPT_RELEASED"


def test_a_dispatch_judged_after_the_lease_ran_out_is_refused_as_lease_expired():
    expired = make_attempt(Stage.UNKNOWN, lease_expires_at=T0)
    transition = apply_report(expired, Report(ReportKind.DISPATCHED), T0)
    assert transition.refused_reason == "LEASE_EXPIRED" and not transition.applied


def test_not_happened_from_others_waits_out_the_lease_and_the_grace():
    mine = make_attempt(Stage.UNKNOWN, 1, lease_expires_at=T0)
    mine.principal_id = "agent-a"
    theirs = make_attempt(Stage.UNKNOWN, 2, lease_expires_at=T0 + timedelta(seconds=5))
    theirs.principal_id = "agent-b"
    both = (mine.attempt_id, theirs.attempt_id)
    # The owner of every attempt settled may settle at once.
    assert not_happened_settles_after([mine], (mine.attempt_id,), "agent-a", 30) is None
    # Anyone else waits for the latest lease end plus the grace.
    assert not_happened_settles_after([mine, theirs], both, "agent-a", 30) == T0 + timedelta(seconds=35)
    assert not_happened_settles_after([mine, theirs], both, "operator", 0) == T0 + timedelta(seconds=5)
    # Attempts that are not being settled do not count.
    assert not_happened_settles_after([mine, theirs], (mine.attempt_id,), "agent-b", 30) == T0 + timedelta(seconds=30)


# --- random report sequences never regress an attempt ---------------------------------------------


class EffectLifecycle(RuleBasedStateMachine):
    """An effect with attempts, driven by reports, lease expiry, reconciliation and new requests.

    Each attempt's stage only ever moves along ALLOWED_EDGES; a terminal stage never changes; a
    recorded receipt never changes; the ledger never creates an attempt past max_attempts or
    after a success; without RETRY_SAME_KEY at most one attempt is open at a time.
    """

    @initialize(max_attempts=st.integers(1, 4), same_key=st.booleans())
    def start(self, max_attempts, same_key):
        self.contract = make_contract(max_attempts=max_attempts, recovery=SAME_KEY if same_key else ())
        self.attempts: list[Attempt] = [make_attempt(Stage.AUTHORIZED)]
        self.effect = make_effect(self.attempts)
        self.now = T0

    def move(self, attempt: Attempt, stage: Stage, receipt: Receipt | None = None) -> None:
        assert edge_allowed(attempt.stage, stage), (attempt.stage, stage)
        attempt.stage = stage
        if stage == Stage.SUCCEEDED:
            assert attempt.receipt is None
            attempt.receipt = receipt
        self.effect.stage = effect_stage(self.attempts)

    @rule(
        index=st.integers(0, 7),
        kind=st.sampled_from(ReportKind),
        evidence=st.sampled_from([None, *FailureEvidence]),
        receipt=st.sampled_from([RECEIPT, OTHER_RECEIPT]),
    )
    def report(self, index, kind, evidence, receipt):
        attempt = self.attempts[index % len(self.attempts)]
        before, before_receipt = attempt.stage, attempt.receipt
        report = Report(
            kind,
            "reason",
            receipt=receipt if kind == ReportKind.SUCCEEDED else None,
            failure_evidence=evidence if kind == ReportKind.FAILED else None,
        )
        transition = apply_report(attempt, report, self.now)
        assert not (transition.applied and transition.refused)
        if transition.applied:
            assert before not in TERMINAL and before != Stage.UNKNOWN
            self.move(attempt, transition.stage, report.receipt)
        else:
            assert transition.stage == before and attempt.receipt == before_receipt

    @rule(seconds=st.integers(0, 120))
    def time_passes_and_leases_expire(self, seconds):
        self.now += timedelta(seconds=seconds)
        for attempt in self.attempts:
            if lease_expired(attempt, self.now):
                self.move(attempt, Stage.UNKNOWN)

    @rule(
        evidence=st.sampled_from([Stage.SUCCEEDED, Stage.FAILED]),
        receipt=st.sampled_from([RECEIPT, OTHER_RECEIPT]),
    )
    def reconcile_effect(self, evidence, receipt):
        settled = reconcile(self.effect, evidence, receipt if evidence == Stage.SUCCEEDED else None)
        if not settled.applied:
            assert not settled.settled_attempts
            return
        for attempt in self.attempts:
            if attempt.attempt_id in settled.settled_attempts:
                self.move(attempt, settled.stage, receipt if evidence == Stage.SUCCEEDED else None)

    @rule()
    def authorize_again(self):
        verdict = ledger_verdict(self.effect, self.contract, DIGEST)
        if not verdict.kind.creates_attempt:
            return
        assert self.effect.stage != Stage.SUCCEEDED
        key = provider_key_for_new_attempt("eff_1", self.attempts, verdict.reuse_provider_key)
        number = len(self.attempts) + 1
        self.attempts.append(
            make_attempt(
                Stage.AUTHORIZED,
                number,
                provider_key=key,
                lease_expires_at=lease_until(self.now, 60),
            )
        )
        self.effect.stage = effect_stage(self.attempts)

    @invariant()
    def attempts_stay_within_max_attempts(self):
        assert counted_attempts(self.attempts) <= self.contract.max_attempts

    @invariant()
    def open_attempts_share_one_provider_key(self):
        open_attempts = [a for a in self.attempts if a.stage in {Stage.AUTHORIZED, Stage.DISPATCHED, Stage.UNKNOWN}]
        assert len({a.provider_key for a in open_attempts}) <= 1
        if Recovery.RETRY_SAME_KEY not in self.contract.allowed_recovery:
            assert len(open_attempts) <= 1

    @invariant()
    def a_success_holds_a_receipt(self):
        for attempt in self.attempts:
            assert (attempt.stage == Stage.SUCCEEDED) == (attempt.receipt is not None)


TestEffectLifecycle = EffectLifecycle.TestCase
TestEffectLifecycle.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


# --- the ledger's verdict -------------------------------------------------------------------------


def test_no_effect_is_a_new_effect():
    verdict = ledger_verdict(None, None, DIGEST)
    assert verdict.kind == VerdictKind.NEW_EFFECT and verdict.kind.creates_attempt


@pytest.mark.parametrize("stage", list(Stage))
def test_a_different_digest_is_key_reuse_whatever_the_stage(stage):
    verdict = ledger_verdict(make_effect([make_attempt(stage)]), make_contract(recovery=SAME_KEY), "e" * 64)
    assert verdict.kind == VerdictKind.KEY_REUSED
    assert [r.code for r in verdict.reasons] == ["IDEMPOTENCY_KEY_REUSED"]
    assert not verdict.kind.creates_attempt


def test_a_succeeded_effect_is_a_duplicate_even_at_the_attempt_limit():
    attempts = [make_attempt(Stage.FAILED, 1), make_attempt(Stage.SUCCEEDED, 2)]
    verdict = ledger_verdict(make_effect(attempts), make_contract(max_attempts=2), DIGEST)
    assert verdict.kind == VerdictKind.DUPLICATE
    assert [r.code for r in verdict.reasons] == ["EFFECT_SUCCEEDED"]


@pytest.mark.parametrize("stage", [Stage.AUTHORIZED, Stage.DISPATCHED, Stage.UNKNOWN])
@pytest.mark.parametrize("contract", [make_contract(), None], ids=["no-same-key", "no-contract"])
def test_an_open_effect_without_retry_same_key_needs_reconciliation(stage, contract):
    verdict = ledger_verdict(make_effect([make_attempt(stage)]), contract, DIGEST)
    assert verdict.kind == VerdictKind.RECONCILE_REQUIRED
    assert [r.code for r in verdict.reasons] == [f"EFFECT_{stage.value}"]


@pytest.mark.parametrize("stage", [Stage.AUTHORIZED, Stage.DISPATCHED, Stage.UNKNOWN])
def test_an_open_effect_with_retry_same_key_gets_a_new_attempt_on_the_same_key(stage):
    attempts = [make_attempt(stage)]
    verdict = ledger_verdict(make_effect(attempts), make_contract(recovery=SAME_KEY), DIGEST)
    assert verdict.kind == VerdictKind.NEW_ATTEMPT and verdict.reuse_provider_key
    assert provider_key_for_new_attempt("eff_1", attempts, verdict.reuse_provider_key) == "eff_1.1"


def test_retry_same_key_stops_at_max_attempts():
    attempts = [
        make_attempt(Stage.UNKNOWN, 1),
        make_attempt(Stage.UNKNOWN, 2, provider_key="eff_1.1"),
    ]
    verdict = ledger_verdict(make_effect(attempts), make_contract(max_attempts=2, recovery=SAME_KEY), DIGEST)
    assert verdict.kind == VerdictKind.RETRY_LIMIT_EXCEEDED
    assert [r.code for r in verdict.reasons] == ["RETRY_LIMIT_EXCEEDED"]
    assert not verdict.kind.creates_attempt


def test_a_failed_effect_gets_a_new_attempt_with_a_fresh_provider_key():
    attempts = [make_attempt(Stage.FAILED, 1)]
    verdict = ledger_verdict(make_effect(attempts), make_contract(max_attempts=2), DIGEST)
    assert verdict.kind == VerdictKind.NEW_ATTEMPT and not verdict.reuse_provider_key
    key = provider_key_for_new_attempt("eff_1", attempts, verdict.reuse_provider_key)
    assert key == "eff_1.2" and key not in {a.provider_key for a in attempts}


def test_a_fresh_key_after_same_key_retries_counts_key_generations():
    attempts = [
        make_attempt(Stage.FAILED, 1),
        make_attempt(Stage.FAILED, 2, provider_key="eff_1.1"),
    ]
    assert provider_key_for_new_attempt("eff_1", attempts, reuse=False) == "eff_1.2"
    assert provider_key_for_new_attempt("eff_1", attempts, reuse=True) == "eff_1.2"  # nothing open to reuse


def test_a_failed_effect_at_max_attempts_is_refused():
    attempts = [make_attempt(Stage.FAILED, 1), make_attempt(Stage.FAILED, 2)]
    verdict = ledger_verdict(make_effect(attempts), make_contract(max_attempts=2), DIGEST)
    assert verdict.kind == VerdictKind.RETRY_LIMIT_EXCEEDED


def test_without_a_pinned_contract_one_attempt_is_the_limit():
    verdict = ledger_verdict(make_effect([make_attempt(Stage.FAILED)]), None, DIGEST)
    assert verdict.kind == VerdictKind.RETRY_LIMIT_EXCEEDED


def test_released_attempts_do_not_count():
    released = [make_attempt(Stage.RELEASED, n) for n in (1, 2, 3)]
    assert counted_attempts(released) == 0
    verdict = ledger_verdict(make_effect(released), make_contract(max_attempts=1), DIGEST)
    assert verdict.kind == VerdictKind.NEW_ATTEMPT
    mixed = [make_attempt(Stage.FAILED, 1), make_attempt(Stage.RELEASED, 2)]
    assert counted_attempts(mixed) == 1
    assert ledger_verdict(make_effect(mixed), make_contract(max_attempts=2), DIGEST).kind == VerdictKind.NEW_ATTEMPT
    assert ledger_verdict(make_effect(mixed), make_contract(max_attempts=1), DIGEST).kind == (
        VerdictKind.RETRY_LIMIT_EXCEEDED
    )


# --- effect_stage, leases -------------------------------------------------------------------------

PRECEDENCE = [
    Stage.SUCCEEDED,
    Stage.UNKNOWN,
    Stage.DISPATCHED,
    Stage.AUTHORIZED,
    Stage.FAILED,
    Stage.RELEASED,
]


@pytest.mark.parametrize(("first", "second"), list(itertools.product(Stage, Stage)))
def test_effect_stage_is_the_strongest_attempt_stage(first, second):
    attempts = [make_attempt(first, 1), make_attempt(second, 2)]
    strongest = min(first, second, key=PRECEDENCE.index)
    assert effect_stage(attempts) == strongest
    assert effect_stage(list(reversed(attempts))) == strongest


def test_effect_stage_examples():
    assert effect_stage([]) == Stage.RELEASED
    assert effect_stage([make_attempt(Stage.FAILED, 1), make_attempt(Stage.SUCCEEDED, 2)]) == Stage.SUCCEEDED
    assert effect_stage([make_attempt(Stage.FAILED, 1), make_attempt(Stage.RELEASED, 2)]) == Stage.FAILED
    assert effect_stage([make_attempt(Stage.RELEASED, 1)]) == Stage.RELEASED


@pytest.mark.parametrize("stage", list(Stage))
def test_lease_expired_only_for_leased_stages_at_or_after_expiry(stage):
    attempt = make_attempt(stage, lease_expires_at=T0)
    leased = stage in {Stage.AUTHORIZED, Stage.DISPATCHED}
    assert lease_expired(attempt, T0 - timedelta(microseconds=1)) is False
    assert lease_expired(attempt, T0) is leased
    assert lease_expired(attempt, T0 + timedelta(hours=1)) is leased


def test_lease_until():
    assert lease_until(T0, 90) == T0 + timedelta(seconds=90)


# --- reconcile -----------------------------------------------------------------------------------


@pytest.mark.parametrize("evidence", [Stage.SUCCEEDED, Stage.FAILED])
def test_reconcile_settles_every_open_attempt_together(evidence):
    attempts = [
        make_attempt(Stage.FAILED, 1),
        make_attempt(Stage.UNKNOWN, 2, provider_key="eff_1.2"),
        make_attempt(Stage.DISPATCHED, 3, provider_key="eff_1.2"),
        make_attempt(Stage.AUTHORIZED, 4, provider_key="eff_1.2"),
        make_attempt(Stage.RELEASED, 5),
    ]
    settled = reconcile(make_effect(attempts), evidence, RECEIPT if evidence == Stage.SUCCEEDED else None)
    assert settled.applied and not settled.refused_reason
    assert settled.stage == evidence
    assert settled.settled_attempts == ("att_2", "att_3", "att_4")


def test_reconcile_echo_of_the_same_receipt_changes_nothing():
    settled = reconcile(make_effect([make_attempt(Stage.SUCCEEDED)]), Stage.SUCCEEDED, RECEIPT)
    assert not settled.applied and not settled.refused_reason and settled.stage == Stage.SUCCEEDED


@pytest.mark.parametrize("receipt", [OTHER_RECEIPT, None], ids=["other-receipt", "no-receipt"])
def test_reconcile_success_with_another_receipt_conflicts(receipt):
    settled = reconcile(make_effect([make_attempt(Stage.SUCCEEDED)]), Stage.SUCCEEDED, receipt)
    assert not settled.applied and settled.refused_reason == "CONFLICTING_OUTCOME"
    assert settled.settled_attempts == ()


def test_reconcile_failure_of_a_succeeded_effect_conflicts():
    settled = reconcile(make_effect([make_attempt(Stage.SUCCEEDED)]), Stage.FAILED, None)
    assert not settled.applied and settled.refused_reason == "CONFLICTING_OUTCOME"


@pytest.mark.parametrize("stage", [Stage.FAILED, Stage.RELEASED])
def test_reconcile_not_happened_on_a_settled_failure_is_an_echo(stage):
    settled = reconcile(make_effect([make_attempt(stage)]), Stage.FAILED, None)
    assert not settled.applied and not settled.refused_reason and settled.stage == stage


@pytest.mark.parametrize("stage", [Stage.FAILED, Stage.RELEASED])
def test_reconcile_success_of_a_settled_failure_conflicts(stage):
    settled = reconcile(make_effect([make_attempt(stage)]), Stage.SUCCEEDED, RECEIPT)
    assert not settled.applied and settled.refused_reason == "CONFLICTING_OUTCOME"


@pytest.mark.parametrize("evidence", [Stage.AUTHORIZED, Stage.DISPATCHED, Stage.UNKNOWN, Stage.RELEASED])
def test_reconcile_with_evidence_other_than_success_or_failure_is_a_programming_error(evidence):
    with pytest.raises(AssertionError):
        reconcile(make_effect([make_attempt(Stage.UNKNOWN)]), evidence, None)
