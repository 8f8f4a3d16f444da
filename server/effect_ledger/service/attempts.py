"""Reports about the attempts the gate authorized, reconciliation with evidence, and the reads
(the general path; PostgreSQL's common reports take ``reports_fast``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from effect_ledger.config import Limits
from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain import lifecycle
from effect_ledger.domain.canonical import canonical_bytes, parse_json, receipt_digest, sha256_hex
from effect_ledger.domain.contracts import (
    check_identifier,
    check_text,
)
from effect_ledger.domain.gate_rules import (
    LookupEvidence,
    foreign_attempts,
    not_happened_refusal,
    not_owned,
    receipt_fact,
)
from effect_ledger.domain.lifecycle import Report
from effect_ledger.domain.model import (
    OPEN_STAGES,
    Attempt,
    Decision,
    Effect,
    FailureEvidence,
    Outcome,
    Principal,
    Reason,
    Receipt,
    Stage,
    ToolContract,
)
from effect_ledger.domain.policy_input import build_reconcile_input
from effect_ledger.domain.retention import Kind
from effect_ledger.errors import (
    CommitThenRaise,
    FailedPrecondition,
    LedgerError,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
)
from effect_ledger.policy.engine import RECONCILE_PACKAGE, PolicyEngine, undefined
from effect_ledger.service import budgets, retention
from effect_ledger.service.budgets import Settlement
from effect_ledger.service.leases import (
    lease_seconds_of,
    locked_effect,
    record_expiries,
    save_effect,
)
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork


@dataclass(frozen=True)
class AttemptResult:
    attempt: Attempt
    effect_stage: Stage
    changed: bool


def parse_receipt(provider_reference: str, detail_json: bytes, now: Any, limits: Limits, field: str) -> Receipt:
    check_text(provider_reference, f"{field}.provider_reference", required=True, length_max=512)
    detail = parse_json(
        detail_json,
        field=f"{field}.detail_json",
        size_max_bytes=limits.receipt_detail_size_max_bytes,
        allow_empty=True,
    )
    detail = {} if detail is None else detail
    return Receipt(
        provider_reference=provider_reference,
        detail=detail,
        digest=receipt_digest(provider_reference=provider_reference, detail=detail),
        recorded_at=now,
    )


def parse_lookup(reference: str, result_json: bytes, limits: Limits, field: str) -> LookupEvidence | None:
    """The structured evidence of a provider lookup, or None when the request carries none."""
    if not reference and not result_json:
        return None
    check_text(reference, f"{field}.lookup_reference", required=True, length_max=512)
    result = parse_json(
        result_json, field=f"{field}.lookup_result_json", size_max_bytes=limits.receipt_detail_size_max_bytes
    )
    return LookupEvidence(reference, result)


def attempt_refusal(reason: str, message: str, attempt: Attempt) -> FailedPrecondition:
    return FailedPrecondition(
        message,
        reason=reason,
        violations=[PreconditionViolation(reason, f"attempt/{attempt.attempt_id}", message)],
        metadata={
            "attempt_id": attempt.attempt_id,
            "stage": attempt.stage.value,
            "lease_expires_at": attempt.lease_expires_at.isoformat(),
        },
    )


def report_payload(effect: Effect, attempt: Attempt, report: Report) -> dict[str, Any]:
    """What a report's trace event says, whatever becomes of it (applied, an echo, refused)."""
    return {
        "effect_id": effect.effect_id,
        "attempt_id": attempt.attempt_id,
        "report": report.kind.value,
        "reason": report.reason,
        "failure_evidence": report.failure_evidence.value if report.failure_evidence else None,
        "receipt": receipt_fact(report.receipt),
        "stage_before": attempt.stage.value,
    }


class AttemptReports:
    """Gate's reports, reconciliation and reads (a part of ``Gate``)."""

    limits: Limits
    reconcile_grace_seconds: float
    policy: PolicyEngine

    async def report(self, unit: UnitOfWork, principal: Principal, attempt_id: str, report: Report) -> AttemptResult:
        tenant = principal.tenant_id
        if report.usage:
            usage = budget_rules.validate_amounts(
                report.usage,
                "succeeded.usage",
                await budgets.dimensions_for(unit, tenant, report.usage),
                keep_zero=True,
            )
            report = replace(report, usage=usage)
        effect, attempt = await self._locked_attempt(unit, principal, attempt_id)
        if report.usage:
            # Usage below the contract's floor posts the floor: the caller cannot lower its count.
            pinned = await repo.contract_revision(unit.connection, tenant, effect.tool, effect.tool_revision)
            assert pinned is not None, "an effect's pinned contract revision is never deleted"
            report = replace(report, usage=budget_rules.floored_usage(report.usage, pinned.default_estimate))
        transition = lifecycle.apply_report(attempt, report, unit.now)
        event_payload = report_payload(effect, attempt, report)
        if transition.refused:
            unit.record_event(
                tenant,
                effect.run_id,
                "attempt.report_refused",
                {**event_payload, "refused_reason": transition.refused_reason},
                principal.principal_id,
            )
            raise CommitThenRaise(attempt_refusal(transition.refused_reason, transition.refused_message, attempt))
        if not transition.applied:
            if report.kind.value != attempt.stage.value:
                unit.record_event(
                    tenant, effect.run_id, "attempt.report_superseded", event_payload, principal.principal_id
                )
            return AttemptResult(attempt, effect.stage, changed=False)
        self._apply(unit, effect, attempt, transition.stage, report)
        if transition.stage == Stage.DISPATCHED:
            # The lease restarts at dispatch, so a long call can heartbeat from here.
            attempt.lease_expires_at = lifecycle.lease_until(unit.now, await lease_seconds_of(unit, tenant, effect))
        siblings = self._deduplicated_siblings(unit, effect, attempt) if transition.stage == Stage.SUCCEEDED else []
        await save_effect(unit, tenant, effect, [attempt, *siblings])
        await self._settle(unit, principal, effect, attempt, transition.stage, report.usage)
        unit.record_event(
            tenant,
            effect.run_id,
            f"attempt.{transition.stage.value.lower()}",
            {**event_payload, "stage": transition.stage.value},
            principal.principal_id,
        )
        if siblings:
            # They asked the provider for the same effect under the same key: one happened.
            # Their money is released; the success posted it once.
            await budgets.settle(unit, tenant, siblings, Settlement.VOID)
            unit.record_event(
                tenant,
                effect.run_id,
                "attempt.deduplicated",
                {
                    "effect_id": effect.effect_id,
                    "by_attempt": attempt.attempt_id,
                    "attempts": [s.attempt_id for s in siblings],
                    "provider_idempotency_key": attempt.provider_key,
                },
                principal.principal_id,
            )
        return AttemptResult(attempt, effect.stage, changed=True)

    def _deduplicated_siblings(self, unit: UnitOfWork, effect: Effect, succeeded: Attempt) -> list[Attempt]:
        """Open attempts that share the succeeded attempt's provider key (RETRY_SAME_KEY): the
        provider deduplicates by that key, so the receipt settles them too."""
        siblings = [
            a
            for a in effect.attempts
            if a.attempt_id != succeeded.attempt_id
            and a.stage in OPEN_STAGES
            and a.provider_key == succeeded.provider_key
        ]
        for sibling in siblings:
            sibling.stage = Stage.SUCCEEDED
            sibling.finished_at = unit.now
            sibling.receipt = succeeded.receipt
            sibling.outcome_reason = (
                f"deduplicated by the provider under key {succeeded.provider_key} (attempt {succeeded.number})"
            )
        if siblings:
            effect.stage = lifecycle.effect_stage(effect.attempts)
        return siblings

    async def _settle(
        self,
        unit: UnitOfWork,
        principal: Principal,
        effect: Effect,
        attempt: Attempt,
        stage: Stage,
        usage: dict[str, int] | None,
    ) -> None:
        """The money follows the outcome: SUCCEEDED posts, a definite no voids, UNKNOWN holds."""
        tenant = principal.tenant_id
        if stage == Stage.SUCCEEDED:
            settled = await budgets.settle(unit, tenant, [attempt], Settlement.POST, usage)
            if usage:
                await budgets.post_unreserved_usage(unit, tenant, effect.run_id, usage, {r.dimension for r in settled})
        elif stage in (Stage.FAILED, Stage.RELEASED):
            await budgets.settle(unit, tenant, [attempt], Settlement.VOID)

    def _apply(self, unit: UnitOfWork, effect: Effect, attempt: Attempt, stage: Stage, report: Report) -> None:
        attempt.stage = stage
        if stage == Stage.DISPATCHED:
            attempt.dispatched_at = unit.now
        else:
            attempt.finished_at = unit.now
            attempt.outcome_reason = report.reason
            attempt.failure_evidence = report.failure_evidence
            attempt.receipt = report.receipt
        effect.stage = lifecycle.effect_stage(effect.attempts)
        effect.updated_at = unit.now

    async def renew_lease(self, unit: UnitOfWork, principal: Principal, attempt_id: str) -> AttemptResult:
        effect, attempt = await self._locked_attempt(unit, principal, attempt_id)
        if attempt.stage == Stage.UNKNOWN:
            raise CommitThenRaise(
                attempt_refusal("LEASE_EXPIRED", "the lease ran out; the attempt is UNKNOWN now", attempt)
            )
        if attempt.stage not in (Stage.AUTHORIZED, Stage.DISPATCHED):
            raise attempt_refusal("ATTEMPT_NOT_OPEN", f"the attempt is {attempt.stage.value}", attempt)
        lease_seconds = await lease_seconds_of(unit, principal.tenant_id, effect)
        attempt.lease_expires_at = lifecycle.lease_until(unit.now, lease_seconds)
        await repo.save_attempt(unit.connection, principal.tenant_id, attempt)
        return AttemptResult(attempt, effect.stage, changed=True)

    async def _locked_attempt(self, unit: UnitOfWork, principal: Principal, attempt_id: str) -> tuple[Effect, Attempt]:
        check_identifier(attempt_id, "attempt_id")
        effect_id = await repo.effect_id_of_attempt(unit.connection, principal.tenant_id, attempt_id)
        if effect_id is None:
            raise NotFound("attempt", attempt_id)
        effect = await locked_effect(unit, principal, effect_id)
        attempt = next(a for a in effect.attempts if a.attempt_id == attempt_id)
        if foreign_attempts(principal, [attempt]):
            raise not_owned(principal, [attempt_id])
        return effect, attempt

    async def reconcile(
        self,
        unit: UnitOfWork,
        principal: Principal,
        effect_id: str,
        receipt: Receipt | None,
        not_happened_reason: str,
        lookup: LookupEvidence | None = None,
    ) -> Effect:
        """Settle an open or unknown effect with evidence: a gated decision, like AuthorizeEffect.

        The service's own rules (attempt ownership; who may say "not happened" and when) give
        its verdict; policy (``data.effectledger.reconcile.decision``) sees that verdict and can
        only refuse more. Either way the answer is recorded as a decision; a refusal commits that
        decision (and nothing of the effect) before it is answered.
        """
        check_identifier(effect_id, "effect_id")
        tenant = principal.tenant_id
        effect = await locked_effect(unit, principal, effect_id)
        evidence_stage = Stage.SUCCEEDED if receipt is not None else Stage.FAILED
        payload: dict[str, Any] = {
            "effect_id": effect.effect_id,
            "evidence": evidence_stage.value,
            "receipt": receipt_fact(receipt),
            "reason": not_happened_reason,
            "stage_before": effect.stage.value,
        }
        if lookup is not None:
            payload["lookup"] = {"reference": lookup.reference, "result": lookup.result}
        foreign = foreign_attempts(principal, [a for a in effect.attempts if a.stage in OPEN_STAGES])
        refusal: LedgerError | None = not_owned(principal, [a.attempt_id for a in foreign]) if foreign else None
        refusal_event: dict[str, Any] | None = None
        settled_ids: tuple[str, ...] = ()
        if refusal is None:
            result = lifecycle.reconcile(effect, evidence_stage, receipt)
            if result.refused_reason:
                unit.record_event(
                    tenant,
                    effect.run_id,
                    "effect.reconcile_refused",
                    {**payload, "refused_reason": result.refused_reason},
                    principal.principal_id,
                )
                raise CommitThenRaise(
                    FailedPrecondition(
                        result.refused_message,
                        reason=result.refused_reason,
                        violations=[
                            PreconditionViolation(result.refused_reason, f"effect/{effect_id}", result.refused_message)
                        ],
                        metadata={"effect_id": effect_id, "stage": effect.stage.value},
                    )
                )
            if not result.applied:
                return effect
            settled_ids = result.settled_attempts
        pinned = await repo.contract_revision(unit.connection, tenant, effect.tool, effect.tool_revision)
        assert pinned is not None, "an effect's pinned contract revision is never deleted"
        settled = [a for a in effect.attempts if a.attempt_id in settled_ids]
        if refusal is None and receipt is None:
            answer = not_happened_refusal(pinned, principal, settled, lookup)
            if answer is not None:
                code, message = answer
                refusal = PermissionDenied(message, reason=code, metadata={"effect_id": effect_id, "tool": effect.tool})
            else:
                refusal, refusal_event = self._lease_wait_refusal(unit, principal, effect, pinned, settled_ids, payload)
        decision = await self._reconcile_decision(
            unit,
            principal,
            effect,
            pinned,
            receipt,
            not_happened_reason,
            lookup,
            settled or [a for a in effect.attempts if a.stage in OPEN_STAGES],
            refusal,
        )
        payload["decision_id"] = decision.decision_id
        if decision.outcome != Outcome.ALLOW:
            if refusal is None:
                codes = ",".join(r.code for r in decision.reasons)
                refusal = PermissionDenied(
                    "policy refused to settle this effect: " + "; ".join(r.message for r in decision.reasons)[:512],
                    reason=decision.reasons[0].code if decision.reasons else "POLICY_DENIED",
                    metadata={"effect_id": effect_id, "policy_reasons": codes},
                )
            if refusal_event is not None:
                unit.record_event(
                    tenant,
                    effect.run_id,
                    "effect.reconcile_refused",
                    {**refusal_event, "decision_id": decision.decision_id},
                    principal.principal_id,
                )
            refusal.metadata["decision_id"] = decision.decision_id
            raise CommitThenRaise(refusal)
        for attempt in settled:
            attempt.stage = evidence_stage
            attempt.finished_at = unit.now
            if receipt is not None:
                attempt.receipt = receipt
                attempt.outcome_reason = "reconciled with a receipt"
            else:
                attempt.failure_evidence = FailureEvidence.PROVIDER_REJECTED
                attempt.outcome_reason = f"reconciled: {not_happened_reason}"
        effect.stage = lifecycle.effect_stage(effect.attempts)
        effect.updated_at = unit.now
        effect.reconciled_by = principal.principal_id
        effect.reconcile_reason = not_happened_reason if receipt is None else "receipt"
        await save_effect(unit, tenant, effect, settled)
        if receipt is not None:
            # Attempts that share a provider key (RETRY_SAME_KEY) asked for one effect, which the
            # provider applied once: its money is posted once, by the first of them; the
            # others' reservations are released, as when a SUCCEEDED report settles siblings.
            first_of_key: dict[str, Attempt] = {}
            for attempt in sorted(settled, key=lambda a: a.number):
                first_of_key.setdefault(attempt.provider_key, attempt)
            posting = list(first_of_key.values())
            posting_ids = {a.attempt_id for a in posting}
            await budgets.settle(unit, tenant, posting, Settlement.POST)
            await budgets.settle(unit, tenant, [a for a in settled if a.attempt_id not in posting_ids], Settlement.VOID)
            await budgets.post_expired_estimates(unit, tenant, posting)
        else:
            await budgets.settle(unit, tenant, settled, Settlement.VOID)
        unit.record_event(
            tenant,
            effect.run_id,
            "effect.reconciled",
            {**payload, "attempts": list(settled_ids), "stage": effect.stage.value},
            principal.principal_id,
        )
        return effect

    async def _reconcile_decision(
        self,
        unit: UnitOfWork,
        principal: Principal,
        effect: Effect,
        pinned: ToolContract,
        receipt: Receipt | None,
        reason: str,
        lookup: LookupEvidence | None,
        attempts: list[Attempt],
        refusal: LedgerError | None,
    ) -> Decision:
        """Evaluate the reconcile policy on the ledger's facts and the service's verdict, and
        record the decision (DENY when either refuses)."""
        refusals = [] if refusal is None else [{"code": refusal.reason, "message": refusal.message}]
        policy_input = build_reconcile_input(
            now=unit.now,
            principal=principal,
            effect=effect,
            contract=pinned,
            evidence_kind="receipt" if receipt is not None else "not_happened",
            reason=reason,
            lookup_reference=lookup.reference if lookup is not None else "",
            has_lookup_result=lookup is not None,
            settled=attempts,
            refusals=refusals,
        )
        input_bytes = canonical_bytes(policy_input)
        answer = await self.policy.evaluate(policy_input, input_bytes, RECONCILE_PACKAGE)
        if answer.outcome not in (Outcome.ALLOW, Outcome.DENY):
            raise undefined(f"the reconcile policy may answer ALLOW or DENY, not {answer.outcome.value}")
        outcome, reasons = answer.outcome, answer.reasons
        if refusal is not None and outcome == Outcome.ALLOW:
            # Policy cannot overrule the service (a policy that ignores input.ledger.refusals).
            outcome, reasons = Outcome.DENY, (Reason(refusal.reason, refusal.message),)
        decision = Decision(
            decision_id=repo.new_id("dec"),
            run_id=effect.run_id,
            effect_id=effect.effect_id,
            attempt_id=None,
            outcome=outcome,
            reasons=reasons,
            policy_revision=answer.revision,
            engine=answer.engine,
            input_digest=sha256_hex(input_bytes),
            input_json=input_bytes,
            intent_digest=effect.intent_digest,
            idempotency_key=effect.idempotency_key,
            principal_id=principal.principal_id,
            tool=effect.tool,
            created_at=unit.now,
        )
        await repo.insert_decision(unit.connection, principal.tenant_id, decision)
        return decision

    def _lease_wait_refusal(
        self,
        unit: UnitOfWork,
        principal: Principal,
        effect: Effect,
        pinned: ToolContract,
        settled: tuple[str, ...],
        payload: dict[str, Any],
    ) -> tuple[LedgerError | None, dict[str, Any] | None]:
        """Refuse "not happened" from anyone but the owner until the grace after the lease ends:
        the error and the trace event's payload, or (None, None)."""
        grace = self.reconcile_grace_seconds
        if grace < 0:
            grace = pinned.lease_seconds
        settle_after = lifecycle.not_happened_settles_after(effect.attempts, settled, principal.principal_id, grace)
        if settle_after is None or settle_after <= unit.now:
            return None, None
        message = (
            f"an attempt of another principal may still be in flight: not_happened is accepted from it "
            f"at any time, from others after {settle_after.isoformat()} (its lease end plus {grace:g} s)"
        )
        event = {**payload, "refused_reason": "RECONCILE_TOO_EARLY", "settle_after": settle_after.isoformat()}
        error = FailedPrecondition(
            message,
            reason="RECONCILE_TOO_EARLY",
            violations=[PreconditionViolation("RECONCILE_TOO_EARLY", f"effect/{effect.effect_id}", message)],
            metadata={
                "effect_id": effect.effect_id,
                "stage": effect.stage.value,
                "settle_after": settle_after.isoformat(),
            },
        )
        return error, event

    async def get_effect(self, unit: UnitOfWork, principal: Principal, effect_id: str) -> Effect:
        check_identifier(effect_id, "effect_id")
        effect = await repo.effect_by_id(unit.connection, principal.tenant_id, effect_id)
        if effect is None:
            raise NotFound("effect", effect_id)
        shown = await record_expiries(unit, principal.tenant_id, [effect])
        if not shown:
            raise NotFound("effect", effect_id)
        return shown[0]

    async def list_open_effects(
        self, unit: UnitOfWork, principal: Principal, run_id: str, after_effect_id: str, page_size: int
    ) -> list[Effect]:
        check_identifier(run_id, "run_id")
        if await repo.get_run(unit.connection, principal.tenant_id, run_id) is None:
            raise NotFound("run", run_id)
        found = await repo.open_effects_of_run(unit.connection, principal.tenant_id, run_id, after_effect_id, page_size)
        return [e for e in await record_expiries(unit, principal.tenant_id, found) if e.stage in OPEN_STAGES]

    async def get_decision(self, unit: UnitOfWork, principal: Principal, decision_id: str) -> Decision:
        check_identifier(decision_id, "decision_id")
        decision = await repo.get_decision(unit.connection, principal.tenant_id, decision_id)
        if decision is None:
            await retention.raise_if_removed(unit, principal.tenant_id, Kind.DECISIONS, decision_id, "decision")
            raise NotFound("decision", decision_id)
        return decision
