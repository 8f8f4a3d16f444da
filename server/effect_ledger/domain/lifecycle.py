"""The lifecycle of an effect and its attempts: what the ledger alone decides.

Stages only move along these edges (anything else is refused, never applied):

    AUTHORIZED -> DISPATCHED | RELEASED | SUCCEEDED | FAILED | UNKNOWN
    DISPATCHED -> SUCCEEDED | FAILED | UNKNOWN
    UNKNOWN    -> SUCCEEDED | FAILED          (ReconcileEffect only, with evidence)

A lease that runs out on an AUTHORIZED or DISPATCHED attempt makes it UNKNOWN: the runtime
may have called the provider and crashed. The strongest known stage never regresses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from effect_ledger.domain.model import (
    DEFINITELY_NOT_APPLIED,
    LEASED_STAGES,
    OPEN_STAGES,
    Attempt,
    Effect,
    FailureEvidence,
    Reason,
    Receipt,
    Recovery,
    Stage,
    ToolContract,
)

ALLOWED_EDGES: dict[Stage, frozenset[Stage]] = {
    Stage.AUTHORIZED: frozenset({Stage.DISPATCHED, Stage.RELEASED, Stage.SUCCEEDED, Stage.FAILED, Stage.UNKNOWN}),
    Stage.DISPATCHED: frozenset({Stage.SUCCEEDED, Stage.FAILED, Stage.UNKNOWN}),
    Stage.UNKNOWN: frozenset({Stage.SUCCEEDED, Stage.FAILED}),
    Stage.SUCCEEDED: frozenset(),
    Stage.FAILED: frozenset(),
    Stage.RELEASED: frozenset(),
}


def edge_allowed(source: Stage, target: Stage) -> bool:
    return target in ALLOWED_EDGES[source]


def effect_stage(attempts: list[Attempt]) -> Stage:
    """The effect's strongest known stage, derived from its attempts.

    SUCCEEDED wins (the effect happened); then anything that may have happened (UNKNOWN, then
    DISPATCHED, then AUTHORIZED); only when every attempt definitely did not apply is the
    effect FAILED (or RELEASED when no attempt was ever made).
    """
    stages = {attempt.stage for attempt in attempts}
    for stage in (Stage.SUCCEEDED, Stage.UNKNOWN, Stage.DISPATCHED, Stage.AUTHORIZED, Stage.FAILED):
        if stage in stages:
            return stage
    return Stage.RELEASED


def counted_attempts(attempts: list[Attempt]) -> int:
    """Attempts that count against max_attempts: a released one never happened."""
    return sum(1 for attempt in attempts if attempt.stage != Stage.RELEASED)


# --- the gate's ledger verdict -------------------------------------------------------------


class VerdictKind(enum.StrEnum):
    NEW_EFFECT = "NEW_EFFECT"
    NEW_ATTEMPT = "NEW_ATTEMPT"
    DUPLICATE = "DUPLICATE"
    RECONCILE_REQUIRED = "RECONCILE_REQUIRED"
    RETRY_LIMIT_EXCEEDED = "RETRY_LIMIT_EXCEEDED"
    KEY_REUSED = "KEY_REUSED"

    @property
    def creates_attempt(self) -> bool:
        return self in (VerdictKind.NEW_EFFECT, VerdictKind.NEW_ATTEMPT)


@dataclass(frozen=True)
class LedgerVerdict:
    kind: VerdictKind
    reasons: tuple[Reason, ...] = ()
    reuse_provider_key: bool = False


def ledger_verdict(effect: Effect | None, pinned: ToolContract | None, request_digest: str) -> LedgerVerdict:
    """What the ledger says about an AuthorizeEffect for an idempotency key, before policy.

    ``effect`` is the effect already bound to the key (its leases already expired), and
    ``request_digest`` the digest of the request computed under the effect's pinned revision.
    """
    if effect is None:
        return LedgerVerdict(VerdictKind.NEW_EFFECT)
    if effect.intent_digest != request_digest:
        return LedgerVerdict(
            VerdictKind.KEY_REUSED,
            (Reason("IDEMPOTENCY_KEY_REUSED", "the key is bound to a different intent"),),
        )
    stage = effect.stage
    if stage == Stage.SUCCEEDED:
        return LedgerVerdict(VerdictKind.DUPLICATE, (Reason("EFFECT_SUCCEEDED", "the effect already happened"),))
    max_attempts = pinned.max_attempts if pinned is not None else 1
    limit_reached = counted_attempts(effect.attempts) >= max_attempts
    if stage in OPEN_STAGES:
        same_key = pinned is not None and Recovery.RETRY_SAME_KEY in pinned.allowed_recovery
        if not same_key:
            return LedgerVerdict(
                VerdictKind.RECONCILE_REQUIRED,
                (Reason(f"EFFECT_{stage.value}", f"an attempt is {stage.value}; reconcile it first"),),
            )
        if limit_reached:
            return _retry_limit(max_attempts)
        return LedgerVerdict(
            VerdictKind.NEW_ATTEMPT,
            (Reason("RETRY_SAME_KEY", "retrying with the same provider key"),),
            reuse_provider_key=True,
        )
    if limit_reached:
        return _retry_limit(max_attempts)
    return LedgerVerdict(
        VerdictKind.NEW_ATTEMPT, (Reason(f"EFFECT_{stage.value}", "a new attempt after a definite failure"),)
    )


def _retry_limit(max_attempts: int) -> LedgerVerdict:
    return LedgerVerdict(
        VerdictKind.RETRY_LIMIT_EXCEEDED,
        (Reason("RETRY_LIMIT_EXCEEDED", f"max_attempts {max_attempts} reached"),),
    )


def provider_key_for_new_attempt(effect_id: str, attempts: list[Attempt], reuse: bool) -> str:
    """Stable across a RETRY_SAME_KEY retry; fresh after a definite failure."""
    if reuse:
        for attempt in reversed(attempts):
            if attempt.stage in OPEN_STAGES:
                return attempt.provider_key
    generations = {attempt.provider_key for attempt in attempts}
    return f"{effect_id}.{len(generations) + 1}"


# --- reports about an attempt ---------------------------------------------------------------


class ReportKind(enum.StrEnum):
    DISPATCHED = "DISPATCHED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    RELEASED = "RELEASED"


@dataclass(frozen=True)
class Report:
    kind: ReportKind
    reason: str = ""
    receipt: Receipt | None = None
    failure_evidence: FailureEvidence | None = None
    # SUCCEEDED: actual usage per dimension (the estimate is posted for dimensions not named).
    usage: dict[str, int] | None = None


@dataclass(frozen=True)
class Transition:
    """What a report does to an attempt.

    ``applied``: the attempt moves to ``stage``. ``refused_reason``: the report contradicts what
    is known; it is refused (and kept in the trace). Neither: an echo or a weaker report.
    """

    stage: Stage
    applied: bool
    refused_reason: str = ""
    refused_message: str = ""

    @property
    def refused(self) -> bool:
        return bool(self.refused_reason)


def _same_receipt(attempt: Attempt, receipt: Receipt | None) -> bool:
    return attempt.receipt is not None and receipt is not None and attempt.receipt.digest == receipt.digest


def apply_report(attempt: Attempt, report: Report, now: datetime) -> Transition:
    """Decide the effect of a runtime's report on an attempt.

    ``now`` is the database clock read after the attempt's effect was locked, and the attempt's
    lease has already been judged by it (expired leases made UNKNOWN).
    """
    stage = attempt.stage
    kind = report.kind
    if kind == ReportKind.DISPATCHED:
        return _dispatch(attempt, now)
    if kind == ReportKind.RELEASED:
        if stage == Stage.AUTHORIZED:
            return Transition(Stage.RELEASED, applied=True)
        if stage == Stage.RELEASED:
            return Transition(stage, applied=False)
        return _refuse(stage, "ATTEMPT_NOT_RELEASABLE", f"an attempt {stage.value} cannot be released")
    target = Stage(kind.value)
    if stage in LEASED_STAGES:
        not_sent = report.failure_evidence == FailureEvidence.NOT_SENT
        if kind == ReportKind.FAILED and not_sent and stage == Stage.DISPATCHED:
            return _refuse(stage, "DISPATCH_RECORDED", "the attempt was dispatched; NOT_SENT contradicts it")
        return Transition(target, applied=True)
    if stage == Stage.UNKNOWN:
        if kind == ReportKind.UNKNOWN:
            return Transition(stage, applied=False)
        return _refuse(stage, "RECONCILE_REQUIRED", "the outcome is UNKNOWN; settle it with ReconcileEffect")
    if stage == Stage.SUCCEEDED:
        if kind == ReportKind.UNKNOWN:
            return Transition(stage, applied=False)
        if kind == ReportKind.SUCCEEDED and _same_receipt(attempt, report.receipt):
            return Transition(stage, applied=False)
        return _refuse(stage, "CONFLICTING_OUTCOME", f"the attempt already SUCCEEDED; {kind.value} refused")
    if stage == Stage.FAILED:
        if kind in (ReportKind.FAILED, ReportKind.UNKNOWN):
            return Transition(stage, applied=False)
        return _refuse(stage, "CONFLICTING_OUTCOME", f"the attempt already FAILED; {kind.value} refused")
    # RELEASED: it was never sent; only an echo of "not sent" is consistent.
    if kind == ReportKind.FAILED and report.failure_evidence == FailureEvidence.NOT_SENT:
        return Transition(stage, applied=False)
    return _refuse(stage, "ATTEMPT_RELEASED", f"the attempt was released; {kind.value} refused")


def _dispatch(attempt: Attempt, now: datetime) -> Transition:
    """A dispatch is accepted only while the attempt may still be sent: AUTHORIZED with a live
    lease (DISPATCHED again, or after SUCCEEDED, is an echo). Every refusal tells the runtime
    not to send; so does an echo whose stage is not DISPATCHED."""
    stage = attempt.stage
    if stage == Stage.AUTHORIZED:
        return Transition(Stage.DISPATCHED, applied=True)
    if stage in (Stage.DISPATCHED, Stage.SUCCEEDED):
        # An echo (a retried dispatch); after SUCCEEDED the effect happened and nothing is sent.
        return Transition(stage, applied=False)
    if stage == Stage.RELEASED:
        return _refuse(stage, "ATTEMPT_RELEASED", "the attempt was released; it must not be sent")
    if stage == Stage.UNKNOWN:
        if attempt.lease_expires_at <= now:
            return _refuse(
                stage,
                "LEASE_EXPIRED",
                "the lease ran out before the dispatch was recorded; the attempt is UNKNOWN: do not send",
            )
        return _refuse(stage, "ATTEMPT_NOT_OPEN", "the attempt's outcome was reported UNKNOWN; do not send")
    return _refuse(stage, "ATTEMPT_SETTLED", f"the attempt is {stage.value}; it must not be sent again")


def _refuse(stage: Stage, reason: str, message: str) -> Transition:
    return Transition(stage, applied=False, refused_reason=reason, refused_message=message)


def lease_expired(attempt: Attempt, now: datetime) -> bool:
    return attempt.stage in LEASED_STAGES and attempt.lease_expires_at <= now


def lease_until(now: datetime, lease_seconds: int) -> datetime:
    return now + timedelta(seconds=lease_seconds)


# --- reconciliation ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reconciliation:
    """How ReconcileEffect settles an effect: the target stage of each open attempt."""

    settled_attempts: tuple[str, ...]
    stage: Stage
    applied: bool
    refused_reason: str = ""
    refused_message: str = ""


def not_happened_settles_after(
    attempts: list[Attempt], settled: tuple[str, ...], principal_id: str, grace_seconds: float
) -> datetime | None:
    """When "it did not happen" may settle these attempts, if not now; None: it may now.

    Its owner (the principal that authorized it, and sends it) may say so at any time. Anyone
    else waits until ``grace_seconds`` after the lease ended: a runtime that dispatched at its
    lease's last moment may still be sending, and a provider asked too early finds nothing. An
    attempt whose sender reported its outcome UNKNOWN (``finished_at`` set) has no sender in
    flight any more, so it does not wait.
    """
    waits = [
        attempt.lease_expires_at + timedelta(seconds=grace_seconds)
        for attempt in attempts
        if attempt.attempt_id in settled and attempt.principal_id != principal_id and attempt.finished_at is None
    ]
    return max(waits) if waits else None


def reconcile(effect: Effect, evidence_stage: Stage, receipt: Receipt | None) -> Reconciliation:
    """Settle every open attempt of an effect with the evidence (a receipt, or 'not happened').

    Several attempts are open together only under RETRY_SAME_KEY, where they share one provider
    key and the provider applied the effect at most once: they settle together.
    """
    assert evidence_stage in (Stage.SUCCEEDED, Stage.FAILED), evidence_stage
    open_ids = tuple(a.attempt_id for a in effect.attempts if a.stage in OPEN_STAGES)
    if open_ids:
        return Reconciliation(open_ids, evidence_stage, applied=True)
    stage = effect.stage
    if stage == Stage.SUCCEEDED and evidence_stage == Stage.SUCCEEDED:
        known = effect.receipt
        if known is not None and receipt is not None and known.digest == receipt.digest:
            return Reconciliation((), stage, applied=False)
        return Reconciliation((), stage, False, "CONFLICTING_OUTCOME", "the effect SUCCEEDED with a different receipt")
    if stage in DEFINITELY_NOT_APPLIED and evidence_stage == Stage.FAILED:
        return Reconciliation((), stage, applied=False)
    return Reconciliation(
        (),
        stage,
        False,
        "CONFLICTING_OUTCOME",
        f"the effect is {stage.value}; evidence of {evidence_stage.value} refused",
    )
