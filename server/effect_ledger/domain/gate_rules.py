"""The gate's pure rules: how the ledger's verdict and policy's answer combine, what a run
forbids whatever policy says, what a lease's end does to an attempt, and the trace events of an
ALLOW. No I/O: the service layer reads the facts and writes what these decide."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from effect_ledger.domain import lifecycle
from effect_ledger.domain.approvals import Intent
from effect_ledger.domain.lifecycle import LedgerVerdict, VerdictKind
from effect_ledger.domain.model import (
    RECONCILING_ROLES,
    Attempt,
    Effect,
    EffectClass,
    Outcome,
    Principal,
    Reason,
    Receipt,
    Recovery,
    Run,
    Stage,
    ToolContract,
)
from effect_ledger.errors import PermissionDenied


@dataclass(frozen=True)
class IntentFacts:
    run: Run
    effect: Effect | None
    current: ToolContract | None
    pinned: ToolContract | None
    revision: int
    digest: str
    verdict: LedgerVerdict
    intent: Intent
    # Effects open at a resume of the run that are still open (the gate refuses new effects).
    obligations: tuple[str, ...] = ()
    # The key's scheduled intent is not due yet (SCHEDULE_NOT_DUE), whatever policy says.
    schedule_refusal: Reason | None = None


def receipt_fact(receipt: Receipt | None) -> dict[str, Any] | None:
    if receipt is None:
        return None
    return {"provider_reference": receipt.provider_reference, "digest": receipt.digest}


def expired_in_memory(effect: Effect, now: Any) -> list[tuple[Attempt, Stage]]:
    """Turn attempts whose lease ran out UNKNOWN (in memory); returns (attempt, stage before)."""
    changed = []
    for attempt in effect.attempts:
        if lifecycle.lease_expired(attempt, now):
            changed.append((attempt, attempt.stage))
            attempt.outcome_reason = f"lease expired while {attempt.stage.value}; the effect may have happened"
            attempt.stage = Stage.UNKNOWN
    if changed:
        effect.stage = lifecycle.effect_stage(effect.attempts)
        effect.updated_at = now
    return changed


def authorized_events(
    effect: Effect, attempt: Attempt, created: bool, decision_id: str, approval_id: str
) -> list[tuple[str, dict[str, Any]]]:
    """The trace events of an ALLOW: the authorization, and the dispatch when it began with it."""
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "effect.authorized" if created else "attempt.authorized",
            {
                "effect_id": effect.effect_id,
                "attempt_id": attempt.attempt_id,
                "attempt_number": attempt.number,
                "decision_id": decision_id,
                "tool": effect.tool,
                "tool_revision": effect.tool_revision,
                "target": effect.target,
                "idempotency_key": effect.idempotency_key,
                "intent_digest": effect.intent_digest,
                "provider_key_reused": attempt.provider_key_reused,
                "lease_expires_at": attempt.lease_expires_at.isoformat(),
                "approval_id": approval_id,
            },
        )
    ]
    if attempt.stage == Stage.DISPATCHED:
        events.append(
            (
                "attempt.dispatched",
                {
                    "effect_id": effect.effect_id,
                    "attempt_id": attempt.attempt_id,
                    "report": "DISPATCHED",
                    "reason": "begin_dispatched",
                    "failure_evidence": None,
                    "receipt": None,
                    "stage_before": Stage.AUTHORIZED.value,
                    "stage": Stage.DISPATCHED.value,
                },
            )
        )
    return events


def combine(
    verdict: LedgerVerdict,
    policy_outcome: Outcome,
    policy_reasons: tuple[Reason, ...],
    current: ToolContract | None,
    pinned: ToolContract | None,
    run_refusals: tuple[Reason, ...] = (),
) -> tuple[Outcome, tuple[Reason, ...]]:
    """The final answer from the ledger's verdict and the policy's decision.

    Policy can only narrow: the ledger's own answers (DUPLICATE, RECONCILE_REQUIRED, the retry
    limit) stand whatever policy says, and an ALLOW needs a live contract and a run that may
    take it (``run_refusals``: its world, its reconciliation after a resume), whatever policy says.
    """
    if not verdict.kind.creates_attempt:
        ledger_outcome = {
            VerdictKind.DUPLICATE: Outcome.DUPLICATE,
            VerdictKind.RECONCILE_REQUIRED: Outcome.RECONCILE_REQUIRED,
            VerdictKind.RETRY_LIMIT_EXCEEDED: Outcome.DENY,
        }[verdict.kind]
        extra = policy_reasons if policy_outcome != Outcome.ALLOW else ()
        return ledger_outcome, verdict.reasons + extra
    binding: list[Reason] = []
    if current is None:
        binding.append(Reason("TOOL_UNKNOWN", "no contract is registered for this tool"))
    elif current.retired:
        binding.append(Reason("TOOL_RETIRED", "the tool is retired and can never be authorized"))
    elif pinned is None:
        binding.append(Reason("CONTRACT_MISSING", "the effect's pinned contract revision is missing"))
    binding.extend(run_refusals)
    if binding:
        policy_extra = tuple(r for r in policy_reasons if r not in binding)
        return Outcome.DENY, tuple(binding) + policy_extra
    if policy_outcome == Outcome.ALLOW:
        return Outcome.ALLOW, verdict.reasons + policy_reasons
    return policy_outcome, policy_reasons


def run_refusals(facts: IntentFacts) -> tuple[Reason, ...]:
    """What the run itself forbids, checked by the service whatever policy says."""
    refusals = [facts.schedule_refusal] if facts.schedule_refusal is not None else []
    contract = facts.pinned or facts.current
    if contract is not None:
        if facts.run.world == "SIMULATED" and not contract.simulator:
            refusals.append(Reason("LIVE_TOOL_IN_SIMULATED_WORLD", "a simulated run's effects never reach a live tool"))
        if facts.run.world == "LIVE" and contract.simulator:
            refusals.append(Reason("SIMULATOR_IN_LIVE_WORLD", "a simulator tool cannot act for a live run"))
    if facts.obligations and contract is not None and contract.effect_class != EffectClass.READ_ONLY:
        own_retry = (
            facts.effect is not None
            and facts.effect.effect_id in facts.obligations
            and facts.verdict.reuse_provider_key
        )
        if not own_retry:
            refusals.append(
                Reason(
                    "RECONCILE_AFTER_RESUME",
                    "reconcile the effects open at the resume first: " + ", ".join(facts.obligations[:10]),
                )
            )
    return tuple(refusals)


def foreign_attempts(principal: Principal, attempts: list[Attempt]) -> list[Attempt]:
    """The attempts among ``attempts`` that ``principal`` may not act on.

    An attempt belongs to the principal that was allowed it. Only that principal, or one with
    a reconciling role (``RECONCILING_ROLES``), may dispatch it, renew its lease, report its
    outcome, release it or reconcile it. An attempt with no recorded owner (authorized before
    owners were recorded) belongs to its tenant's agents, as it did then.
    """
    if principal.has_any(RECONCILING_ROLES):
        return []
    return [a for a in attempts if a.principal_id and a.principal_id != principal.principal_id]


def not_owned(principal: Principal, attempt_ids: list[str]) -> PermissionDenied:
    return PermissionDenied(
        "the attempt belongs to another principal: only it, an operator or an admin may act on it",
        reason="ATTEMPT_NOT_OWNED",
        metadata={"attempt_ids": ",".join(attempt_ids), "principal_id": principal.principal_id},
    )


@dataclass(frozen=True)
class LookupEvidence:
    """A provider lookup that found nothing: the reference it was made under and its answer."""

    reference: str
    result: dict[str, Any]


def not_happened_refusal(
    contract: ToolContract, principal: Principal, settled: list[Attempt], lookup: LookupEvidence | None
) -> tuple[str, str] | None:
    """Whether ``principal`` may settle ``settled`` (open attempts) as "not happened": None if
    it may, else (reason, message). Enforced whatever policy says.

    An attempt's own principal would clear its own uncertainty, so it may do so only for a
    tool whose contract lists QUERY_THEN_RETRY, with the provider lookup as evidence. Anyone
    else needs a reconciling role (four eyes: an operator who owns one of the attempts counts as
    their owner). MANUAL_ONLY, RETRY_SAME_KEY (the provider deduplicates: authorize again under
    the same key instead) and a contract that lists no recovery all leave it to an operator.
    """
    owners = {attempt.principal_id for attempt in settled if attempt.principal_id}
    owner = principal.principal_id in owners or not owners
    if principal.has_any(RECONCILING_ROLES) and principal.principal_id not in owners:
        return None
    if owner and Recovery.QUERY_THEN_RETRY in contract.allowed_recovery:
        if lookup is None:
            return (
                "LOOKUP_EVIDENCE_REQUIRED",
                "the tool is QUERY_THEN_RETRY: settle with the provider lookup's reference and result",
            )
        return None
    recoveries = ", ".join(r.value for r in contract.allowed_recovery) or "none"
    message = (
        "only an operator or an admin that is not the attempt's principal may settle it as not happened "
        f"(allowed_recovery: {recoveries})"
    )
    return "RECONCILE_NEEDS_OPERATOR", message
