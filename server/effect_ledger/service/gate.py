"""The final gate and the reports about the attempts it authorized.

Every function here runs inside one unit of work (one database transaction): whatever it
decides is written together with the decision record and the trace events, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from effect_ledger.config import Limits
from effect_ledger.domain import lifecycle
from effect_ledger.domain.canonical import canonical_bytes, intent_digest, parse_json, receipt_digest, sha256_hex
from effect_ledger.domain.contracts import (
    argument_violations,
    check_identifier,
    check_target,
    check_text,
    check_tool_name,
)
from effect_ledger.domain.lifecycle import LedgerVerdict, Report, VerdictKind
from effect_ledger.domain.model import (
    OPEN_STAGES,
    Attempt,
    Decision,
    Effect,
    EffectClass,
    FailureEvidence,
    Outcome,
    Principal,
    Reason,
    Receipt,
    Run,
    Stage,
    ToolContract,
)
from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain.approvals import Intent
from effect_ledger.domain.budgets import Budget
from effect_ledger.domain.policy_input import build_policy_input
from effect_ledger.errors import (
    CommitThenRaise,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PreconditionViolation,
)
from effect_ledger.policy.engine import PolicyDecision, PolicyEngine
from effect_ledger.service import approvals, budgets
from effect_ledger.service.approvals import ApprovalSettings
from effect_ledger.service.budgets import Settlement
from effect_ledger.storage import budget_store, checkpoint_store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork

LEDGER_ENGINE = "ledger"
SYSTEM_SWEEPER = "system:lease-sweeper"


@dataclass(frozen=True)
class AuthorizeRequest:
    run_id: str
    tool: str
    arguments_json: bytes
    idempotency_key: str
    target: str
    estimate: dict[str, int] = field(default_factory=dict)
    # On ALLOW the attempt starts DISPATCHED (the runtime sends right away).
    begin_dispatched: bool = False


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


@dataclass(frozen=True)
class Admission:
    effect: Effect | None
    attempt: Attempt | None
    approval_request_id: str
    reservation_ids: tuple[str, ...]
    approval_id: str
    refusal: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class AuthorizeResult:
    outcome: Outcome
    effect_id: str
    attempt: Attempt | None
    intent_digest: str
    reasons: tuple[Reason, ...]
    decision_id: str
    policy_revision: str
    receipt: Receipt | None
    tool_revision: int
    effect_stage: Stage | None
    approval_request_id: str = ""
    reservation_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttemptResult:
    attempt: Attempt
    effect_stage: Stage
    changed: bool


def validate_authorize(request: AuthorizeRequest, limits: Limits) -> dict[str, Any]:
    """Input checks that need no database; returns the parsed arguments."""
    check_identifier(request.run_id, "run_id")
    check_tool_name(request.tool)
    check_identifier(request.idempotency_key, "idempotency_key")
    check_target(request.target)
    return parse_json(
        request.arguments_json, field="arguments_json", size_max_bytes=limits.arguments_size_max_bytes
    )


def parse_receipt(
    provider_reference: str, detail_json: bytes, now: Any, limits: Limits, field: str
) -> Receipt:
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


def _receipt_fact(receipt: Receipt | None) -> dict[str, Any] | None:
    if receipt is None:
        return None
    return {"provider_reference": receipt.provider_reference, "digest": receipt.digest}


# --- leases --------------------------------------------------------------------------------


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


async def expire_leases(unit: UnitOfWork, tenant_id: str, effect: Effect, principal_id: str) -> int:
    """Expire leases by the database clock: record each expiry in the trace, save it, and let
    go of the money of attempts that were never dispatched (a dispatched one keeps it held)."""
    changed = expired_in_memory(effect, unit.now)
    for attempt, previous in changed:
        unit.record_event(
            tenant_id,
            effect.run_id,
            "attempt.lease_expired",
            {
                "effect_id": effect.effect_id,
                "attempt_id": attempt.attempt_id,
                "from": previous.value,
                "lease_expires_at": attempt.lease_expires_at.isoformat(),
            },
            principal_id,
        )
    if changed:
        await _save(unit, tenant_id, effect, [attempt for attempt, _ in changed])
        never_dispatched = [attempt for attempt, previous in changed if previous == Stage.AUTHORIZED]
        await budgets.settle(unit, tenant_id, never_dispatched, Settlement.EXPIRE)
    return len(changed)


async def _save(unit: UnitOfWork, tenant_id: str, effect: Effect, attempts: list[Attempt]) -> None:
    for attempt in attempts:
        await repo.save_attempt(unit.connection, tenant_id, attempt)
    await repo.save_effect_state(unit.connection, tenant_id, effect)


async def _lease_seconds(unit: UnitOfWork, tenant_id: str, effect: Effect) -> int:
    contract = await repo.contract_revision(unit.connection, tenant_id, effect.tool, effect.tool_revision)
    assert contract is not None, "an effect's pinned contract revision is never deleted"
    return contract.lease_seconds


def adopt_clock(unit: UnitOfWork, locked: repo.LockedEffect | None) -> Effect | None:
    """Judge the locked effect's leases by the clock read after its lock was granted.

    A clock read before the lock (the authentication query's) may be older than a commit the
    lock waited for, and a lease judged by it may be live for this writer while a reader has
    already shown it run out: one lease, two answers. From here on the unit uses the later time
    for every judgment, for the leases it starts and for the records it writes.
    """
    if locked is None:
        return None
    if locked.now > unit.now:
        unit.now = locked.now
    return locked.effect


async def _locked_effect(unit: UnitOfWork, principal: Principal, effect_id: str) -> Effect:
    effect = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, principal.tenant_id, effect_id))
    if effect is None:
        raise NotFound("effect", effect_id)
    await expire_leases(unit, principal.tenant_id, effect, principal.principal_id)
    return effect


async def record_expiries(unit: UnitOfWork, tenant_id: str, found: list[Effect]) -> list[Effect]:
    """What a read shows: an effect whose lease ran out by the read's clock is locked, judged
    again by the clock read after its lock, and the expiry recorded before the read answers.
    So an attempt a read has shown UNKNOWN is UNKNOWN in the ledger, and a late dispatch
    cannot revive it."""
    shown = []
    for effect in found:
        if any(lifecycle.lease_expired(attempt, unit.now) for attempt in effect.attempts):
            locked = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, tenant_id, effect.effect_id))
            if locked is None:
                continue
            await expire_leases(unit, tenant_id, locked, SYSTEM_SWEEPER)
            effect = locked
        shown.append(effect)
    return shown


# --- AuthorizeEffect -----------------------------------------------------------------------


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
                {"effect_id": effect.effect_id, "attempt_id": attempt.attempt_id, "report": "DISPATCHED",
                 "reason": "begin_dispatched", "failure_evidence": None, "receipt": None,
                 "stage_before": Stage.AUTHORIZED.value, "stage": Stage.DISPATCHED.value},
            )
        )
    return events


class Gate:
    def __init__(
        self,
        policy: PolicyEngine,
        limits: Limits,
        approval_settings: ApprovalSettings | None = None,
        reconcile_grace_seconds: float = -1.0,
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.approval_settings = approval_settings or ApprovalSettings()
        # Negative: each attempt's own lease length.
        self.reconcile_grace_seconds = reconcile_grace_seconds

    async def authorize(
        self, unit: UnitOfWork, principal: Principal, request: AuthorizeRequest, arguments: dict[str, Any]
    ) -> AuthorizeResult:
        facts = await self._intent_facts(unit, principal, request, arguments)
        if facts.verdict.kind == VerdictKind.KEY_REUSED:
            await self._refuse_reused_key(unit, principal, request, facts.effect, facts.digest, facts.verdict)
        contract = facts.pinned or facts.current
        wanted = budget_rules.merged_estimate(request.estimate, contract.default_estimate if contract else {})
        estimate = budget_rules.validate_amounts(wanted, "estimate", await budgets.dimensions_for(unit, principal.tenant_id, wanted))
        applicable = await budget_store.applicable_budgets(
            unit.connection, principal.tenant_id, facts.run.run_id, facts.run.root_run_id, unit.now
        )
        policy_input = await self._policy_input(unit, principal, request, arguments, facts, estimate, applicable)
        input_bytes = canonical_bytes(policy_input)  # the engine and the decision record get the same bytes
        policy_decision = await self.policy.evaluate(policy_input, input_bytes)
        outcome, reasons = combine(
            facts.verdict, policy_decision.outcome, policy_decision.reasons, facts.current, facts.pinned,
            run_refusals(facts),
        )
        decision = Decision(
            decision_id=repo.new_id("dec"),
            run_id=facts.run.run_id,
            effect_id=facts.effect.effect_id if facts.effect is not None else None,
            attempt_id=None,
            outcome=outcome,
            reasons=reasons,
            policy_revision=policy_decision.revision,
            engine=policy_decision.engine,
            input_digest=sha256_hex(input_bytes),
            input_json=input_bytes,
            intent_digest=facts.digest,
            idempotency_key=request.idempotency_key,
            principal_id=principal.principal_id,
            tool=request.tool,
            created_at=unit.now,
        )
        admitted = Admission(facts.effect, None, "", (), "")
        if outcome == Outcome.ALLOW:
            admitted = await self._admit(
                unit, principal, request, arguments, facts, policy_decision, estimate, applicable, decision.decision_id,
                policy_input["approvals"],
            )
            if admitted.refusal:
                decision = replace(decision, outcome=Outcome.DENY, reasons=admitted.refusal)
            else:
                decision = replace(decision, effect_id=admitted.effect.effect_id, attempt_id=admitted.attempt.attempt_id)
        elif outcome == Outcome.REQUIRE_APPROVAL:
            requested = await approvals.ensure_request(
                unit, principal, facts.intent, request.target, arguments,
                quorum=policy_decision.quorum, reusable=False,
                reason="the gate answered REQUIRE_APPROVAL", ttl_seconds=self.approval_settings.ttl_seconds_default,
            )
            admitted = replace(admitted, approval_request_id=requested.approval_id)
        await repo.insert_decision(unit.connection, principal.tenant_id, decision)
        effect = admitted.effect
        return AuthorizeResult(
            outcome=decision.outcome,
            effect_id=effect.effect_id if effect is not None else "",
            attempt=admitted.attempt,
            intent_digest=facts.digest,
            reasons=decision.reasons,
            decision_id=decision.decision_id,
            policy_revision=policy_decision.revision,
            receipt=effect.receipt if (effect is not None and outcome == Outcome.DUPLICATE) else None,
            tool_revision=facts.revision,
            effect_stage=effect.stage if effect is not None else None,
            approval_request_id=admitted.approval_request_id,
            reservation_ids=admitted.reservation_ids,
        )

    async def _intent_facts(
        self, unit: UnitOfWork, principal: Principal, request: AuthorizeRequest, arguments: dict[str, Any]
    ) -> IntentFacts:
        """The run, the effect bound to the key (leases expired), the contracts, the digest, the verdict."""
        tenant = principal.tenant_id
        connection = unit.connection
        run = await repo.get_run(connection, tenant, request.run_id)
        if run is None:
            raise NotFound("run", request.run_id)
        effect = adopt_clock(unit, await repo.lock_effect_by_key(connection, tenant, request.idempotency_key))
        current = await repo.latest_contract(connection, tenant, request.tool)
        if effect is not None:
            await expire_leases(unit, tenant, effect, principal.principal_id)
            pinned = (
                current
                if current is not None and current.tool == effect.tool and current.revision == effect.tool_revision
                else await repo.contract_revision(connection, tenant, effect.tool, effect.tool_revision)
            )
            revision = effect.tool_revision
        else:
            pinned = current
            revision = current.revision if current is not None else 0
        digest = intent_digest(tool=request.tool, tool_revision=revision, target=request.target, arguments=arguments)
        verdict = lifecycle.ledger_verdict(effect, pinned, digest)
        if verdict.kind == VerdictKind.NEW_EFFECT and current is not None and current.arguments_schema:
            violations = argument_violations(current.arguments_schema, arguments)
            if violations:
                raise InvalidArgument(
                    "the arguments do not satisfy the tool's arguments schema",
                    reason="ARGUMENTS_SCHEMA_VIOLATION",
                    violations=violations,
                )
        if effect is None and run.parent_run_id:
            effect, verdict = await self._ancestor_verdict(unit, tenant, run, request, arguments, verdict)
            if effect is not None:
                # Judged under the revision the ancestor's effect is pinned to, like a retry of its key.
                pinned = await repo.contract_revision(connection, tenant, effect.tool, effect.tool_revision)
                revision, digest = effect.tool_revision, effect.intent_digest
        intent = Intent(run.run_id, request.tool, revision, digest)
        obligations = tuple(await checkpoint_store.outstanding_obligations(connection, tenant, run.run_id))
        return IntentFacts(
            run, effect, current, pinned if effect is not None else current, revision, digest, verdict, intent, obligations
        )

    async def _ancestor_verdict(
        self, unit: UnitOfWork, tenant: str, run: Run, request: AuthorizeRequest, arguments: dict[str, Any],
        verdict: LedgerVerdict,
    ) -> tuple[Effect | None, LedgerVerdict]:
        """A fork sees the effects of the runs it came from and never re-executes them."""
        chain = []
        current_run: Run | None = run
        while current_run is not None and current_run.parent_run_id and len(chain) < 16:
            chain.append(current_run.parent_run_id)
            current_run = await repo.get_run(unit.connection, tenant, current_run.parent_run_id)
        found = await checkpoint_store.ancestor_effect(
            unit.connection, tenant, chain, request.tool, request.target,
            lambda revision: intent_digest(tool=request.tool, tool_revision=revision, target=request.target, arguments=arguments),
        )
        if found is None:
            return None, verdict
        effect = await repo.effect_by_id(unit.connection, tenant, found.effect_id)
        if effect is None:
            return None, verdict
        expired_in_memory(effect, unit.now)
        if effect.stage == Stage.SUCCEEDED:
            return effect, LedgerVerdict(
                VerdictKind.DUPLICATE, (Reason("EFFECT_SETTLED_IN_PARENT", f"run {found.run_id} already did it"),)
            )
        return effect, LedgerVerdict(
            VerdictKind.RECONCILE_REQUIRED,
            (Reason("EFFECT_OPEN_IN_PARENT", f"run {found.run_id} has it {effect.stage.value}"),),
        )

    async def _policy_input(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        facts: IntentFacts,
        estimate: dict[str, int],
        applicable: list[Budget],
    ) -> dict[str, Any]:
        effect = facts.effect
        run_open, on_target = await repo.effects_for_policy(
            unit.connection, principal.tenant_id, facts.run.run_id, request.tool, request.target,
            self.limits.run_open_effects_in_policy_max, self.limits.target_unknown_effects_in_policy_max + 1,
        )
        return build_policy_input(
            now=unit.now,
            principal=principal,
            run=facts.run,
            tool=request.tool,
            target=request.target,
            idempotency_key=request.idempotency_key,
            arguments=arguments,
            intent_digest=facts.digest,
            contract=facts.current,
            pinned_contract=facts.pinned if effect is not None else None,
            effect=effect,
            verdict=facts.verdict,
            run_open_effects=run_open,
            run_open_effects_limit=self.limits.run_open_effects_in_policy_max,
            target_unknown_effects=[
                item for item in on_target if effect is None or item["effect_id"] != effect.effect_id
            ][: self.limits.target_unknown_effects_in_policy_max],
            estimate=estimate,
            budgets=[budget.as_policy_fact(estimate.get(budget.dimension, 0)) for budget in applicable],
            approvals=await approvals.facts_for_intent(unit, principal, facts.intent),
            pending_reconciliation=facts.obligations,
        )

    async def _admit(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        facts: IntentFacts,
        policy_decision: PolicyDecision,
        estimate: dict[str, int],
        applicable: list[Budget],
        decision_id: str,
        approval_facts: list[dict[str, Any]],
    ) -> Admission:
        """Turn policy's ALLOW into an attempt: the approval it relied on is re-checked (binding
        facts, whatever policy said), the estimate reserved, then the approval used up."""
        assert facts.pinned is not None  # combine() never allows without a contract
        approval = None
        if policy_decision.approval_id:
            approval, problems = await approvals.usable_approval(unit, principal, policy_decision.approval_id, facts.intent)
            if problems:
                seen = next((a for a in approval_facts if a["approval_id"] == policy_decision.approval_id), None)
                if seen is not None and not seen["binding_problems"]:
                    # It bound the intent when the facts were read and does not under the lock: a
                    # concurrent transaction used (or revoked) it in between. Run again, so the
                    # answer comes from what that transaction committed.
                    raise Conflict("the approval changed concurrently")
                refusal = tuple(Reason(code, f"approval {policy_decision.approval_id}") for code in problems)
                return Admission(facts.effect, None, "", (), "", (Reason("APPROVAL_INVALID", "the approval policy relied on does not bind this intent"),) + refusal)
        effect_id = facts.effect.effect_id if facts.effect is not None else repo.new_id("eff")
        attempt_id = repo.new_id("att")
        reservation_ids, exhausted = await budgets.reserve(
            unit, principal.tenant_id, applicable, estimate, attempt_id, effect_id
        )
        if exhausted is not None:
            return Admission(
                facts.effect, None, "", (), "",
                (Reason("BUDGET_EXHAUSTED", f"dimension {exhausted}: the estimate does not fit in the budget"),),
            )
        effect, attempt = await self._create_attempt(
            unit, principal, request, arguments, facts.digest, facts.pinned, facts.effect, facts.verdict,
            decision_id, effect_id, attempt_id, approval.approval_id if approval else "",
        )
        if approval is not None and not (approval.reusable and policy_decision.reuse_approval):
            await approvals.consume(unit, principal, approval, attempt.attempt_id)
        return Admission(effect, attempt, "", tuple(reservation_ids), approval.approval_id if approval else "")

    async def _refuse_reused_key(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        effect: Effect | None,
        digest: str,
        verdict: LedgerVerdict,
    ) -> None:
        """Record the refusal, commit it, and answer FAILED_PRECONDITION: never ALLOW."""
        assert effect is not None
        decision_id = repo.new_id("dec")
        facts = {"idempotency_key": request.idempotency_key, "bound_digest": effect.intent_digest, "request_digest": digest}
        input_bytes = canonical_bytes(facts)
        await repo.insert_decision(
            unit.connection,
            principal.tenant_id,
            Decision(
                decision_id=decision_id,
                run_id=request.run_id,
                effect_id=effect.effect_id,
                attempt_id=None,
                outcome=Outcome.DENY,
                reasons=verdict.reasons,
                policy_revision=await self.policy.revision(),
                engine=LEDGER_ENGINE,
                input_digest=sha256_hex(input_bytes),
                input_json=input_bytes,
                intent_digest=digest,
                idempotency_key=request.idempotency_key,
                principal_id=principal.principal_id,
                tool=request.tool,
                created_at=unit.now,
            ),
        )
        raise CommitThenRaise(
            FailedPrecondition(
                "the idempotency key is bound to a different intent (tool, target or arguments)",
                reason="IDEMPOTENCY_KEY_REUSED",
                violations=[
                    PreconditionViolation(
                        "IDEMPOTENCY_KEY_REUSED",
                        f"effect/{effect.effect_id}",
                        f"key {request.idempotency_key!r} is bound to digest {effect.intent_digest}",
                    )
                ],
                metadata={"effect_id": effect.effect_id, "decision_id": decision_id, "bound_digest": effect.intent_digest},
            )
        )

    async def _create_attempt(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        digest: str,
        contract: ToolContract,
        effect: Effect | None,
        verdict: LedgerVerdict,
        decision_id: str,
        effect_id: str,
        attempt_id: str,
        approval_id: str,
    ) -> tuple[Effect, Attempt]:
        tenant = principal.tenant_id
        created = effect is None
        if effect is None:
            effect = Effect(
                effect_id=effect_id,
                run_id=request.run_id,
                tool=request.tool,
                tool_revision=contract.revision,
                target=request.target,
                idempotency_key=request.idempotency_key,
                intent_digest=digest,
                arguments=arguments,
                stage=Stage.DISPATCHED if request.begin_dispatched else Stage.AUTHORIZED,
                created_at=unit.now,
                updated_at=unit.now,
            )
            if not await repo.insert_effect_if_absent(unit.connection, tenant, effect):
                # Another replica bound the key first: start over and answer from its effect.
                raise Conflict("the idempotency key was bound concurrently")
        attempt = Attempt(
            attempt_id=attempt_id,
            effect_id=effect.effect_id,
            number=len(effect.attempts) + 1,
            stage=Stage.DISPATCHED if request.begin_dispatched else Stage.AUTHORIZED,
            dispatched_at=unit.now if request.begin_dispatched else None,
            provider_key=lifecycle.provider_key_for_new_attempt(
                effect.effect_id, effect.attempts, verdict.reuse_provider_key
            ),
            provider_key_reused=verdict.reuse_provider_key,
            lease_expires_at=lifecycle.lease_until(unit.now, contract.lease_seconds),
            authorized_at=unit.now,
            decision_id=decision_id,
            approval_id=approval_id,
            principal_id=principal.principal_id,
        )
        await repo.insert_attempt(unit.connection, tenant, attempt)
        effect.attempts.append(attempt)
        effect.stage = lifecycle.effect_stage(effect.attempts)
        effect.updated_at = unit.now
        if not created:
            await repo.save_effect_state(unit.connection, tenant, effect)
        for event_type, payload in authorized_events(effect, attempt, created, decision_id, approval_id):
            unit.record_event(tenant, effect.run_id, event_type, payload, principal.principal_id)
        return effect, attempt

    # --- reports ---------------------------------------------------------------------------

    async def report(
        self, unit: UnitOfWork, principal: Principal, attempt_id: str, report: Report
    ) -> AttemptResult:
        tenant = principal.tenant_id
        if report.usage:
            usage = budget_rules.validate_amounts(
                report.usage, "succeeded.usage", await budgets.dimensions_for(unit, tenant, report.usage), keep_zero=True
            )
            report = replace(report, usage=usage)
        effect, attempt = await self._locked_attempt(unit, principal, attempt_id)
        transition = lifecycle.apply_report(attempt, report, unit.now)
        event_payload = {
            "effect_id": effect.effect_id,
            "attempt_id": attempt.attempt_id,
            "report": report.kind.value,
            "reason": report.reason,
            "failure_evidence": report.failure_evidence.value if report.failure_evidence else None,
            "receipt": _receipt_fact(report.receipt),
            "stage_before": attempt.stage.value,
        }
        if transition.refused:
            unit.record_event(
                tenant, effect.run_id, "attempt.report_refused",
                {**event_payload, "refused_reason": transition.refused_reason}, principal.principal_id,
            )
            raise CommitThenRaise(_refusal(transition.refused_reason, transition.refused_message, attempt))
        if not transition.applied:
            if report.kind.value != attempt.stage.value:
                unit.record_event(
                    tenant, effect.run_id, "attempt.report_superseded", event_payload, principal.principal_id
                )
            return AttemptResult(attempt, effect.stage, changed=False)
        self._apply(unit, effect, attempt, transition.stage, report)
        if transition.stage == Stage.DISPATCHED:
            # The lease restarts at dispatch, so a long call can heartbeat from here.
            attempt.lease_expires_at = lifecycle.lease_until(unit.now, await _lease_seconds(unit, tenant, effect))
        siblings = self._deduplicated_siblings(unit, effect, attempt) if transition.stage == Stage.SUCCEEDED else []
        await _save(unit, tenant, effect, [attempt, *siblings])
        await self._settle(unit, principal, effect, attempt, transition.stage, report.usage)
        unit.record_event(
            tenant, effect.run_id, f"attempt.{transition.stage.value.lower()}",
            {**event_payload, "stage": transition.stage.value}, principal.principal_id,
        )
        if siblings:
            # They asked the provider for the same effect under the same key: one happened.
            # Their money is released; the success posted it once.
            await budgets.settle(unit, tenant, siblings, Settlement.VOID)
            unit.record_event(
                tenant, effect.run_id, "attempt.deduplicated",
                {"effect_id": effect.effect_id, "by_attempt": attempt.attempt_id,
                 "attempts": [s.attempt_id for s in siblings], "provider_idempotency_key": attempt.provider_key},
                principal.principal_id,
            )
        return AttemptResult(attempt, effect.stage, changed=True)

    def _deduplicated_siblings(self, unit: UnitOfWork, effect: Effect, succeeded: Attempt) -> list[Attempt]:
        """Open attempts that share the succeeded attempt's provider key (RETRY_SAME_KEY): the
        provider deduplicates by that key, so the receipt settles them too."""
        siblings = [
            a for a in effect.attempts
            if a.attempt_id != succeeded.attempt_id and a.stage in OPEN_STAGES and a.provider_key == succeeded.provider_key
        ]
        for sibling in siblings:
            sibling.stage = Stage.SUCCEEDED
            sibling.finished_at = unit.now
            sibling.receipt = succeeded.receipt
            sibling.outcome_reason = f"deduplicated by the provider under key {succeeded.provider_key} (attempt {succeeded.number})"
        if siblings:
            effect.stage = lifecycle.effect_stage(effect.attempts)
        return siblings

    async def _settle(
        self, unit: UnitOfWork, principal: Principal, effect: Effect, attempt: Attempt, stage: Stage,
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
                _refusal("LEASE_EXPIRED", "the lease ran out; the attempt is UNKNOWN now", attempt)
            )
        if attempt.stage not in (Stage.AUTHORIZED, Stage.DISPATCHED):
            raise _refusal("ATTEMPT_NOT_OPEN", f"the attempt is {attempt.stage.value}", attempt)
        lease_seconds = await _lease_seconds(unit, principal.tenant_id, effect)
        attempt.lease_expires_at = lifecycle.lease_until(unit.now, lease_seconds)
        await repo.save_attempt(unit.connection, principal.tenant_id, attempt)
        return AttemptResult(attempt, effect.stage, changed=True)

    async def _locked_attempt(
        self, unit: UnitOfWork, principal: Principal, attempt_id: str
    ) -> tuple[Effect, Attempt]:
        check_identifier(attempt_id, "attempt_id")
        effect_id = await repo.effect_id_of_attempt(unit.connection, principal.tenant_id, attempt_id)
        if effect_id is None:
            raise NotFound("attempt", attempt_id)
        effect = await _locked_effect(unit, principal, effect_id)
        attempt = next(a for a in effect.attempts if a.attempt_id == attempt_id)
        return effect, attempt

    # --- reconciliation --------------------------------------------------------------------

    async def reconcile(
        self,
        unit: UnitOfWork,
        principal: Principal,
        effect_id: str,
        receipt: Receipt | None,
        not_happened_reason: str,
    ) -> Effect:
        check_identifier(effect_id, "effect_id")
        tenant = principal.tenant_id
        effect = await _locked_effect(unit, principal, effect_id)
        evidence_stage = Stage.SUCCEEDED if receipt is not None else Stage.FAILED
        result = lifecycle.reconcile(effect, evidence_stage, receipt)
        payload = {
            "effect_id": effect.effect_id,
            "evidence": evidence_stage.value,
            "receipt": _receipt_fact(receipt),
            "reason": not_happened_reason,
            "stage_before": effect.stage.value,
        }
        if result.refused_reason:
            unit.record_event(
                tenant, effect.run_id, "effect.reconcile_refused",
                {**payload, "refused_reason": result.refused_reason}, principal.principal_id,
            )
            raise CommitThenRaise(
                FailedPrecondition(
                    result.refused_message,
                    reason=result.refused_reason,
                    violations=[PreconditionViolation(result.refused_reason, f"effect/{effect_id}", result.refused_message)],
                    metadata={"effect_id": effect_id, "stage": effect.stage.value},
                )
            )
        if not result.applied:
            return effect
        if receipt is None:
            await self._wait_out_leases(unit, principal, effect, result.settled_attempts, payload)
        settled = [a for a in effect.attempts if a.attempt_id in result.settled_attempts]
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
        await _save(unit, tenant, effect, settled)
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
            tenant, effect.run_id, "effect.reconciled",
            {**payload, "attempts": list(result.settled_attempts), "stage": effect.stage.value},
            principal.principal_id,
        )
        return effect

    async def _wait_out_leases(
        self, unit: UnitOfWork, principal: Principal, effect: Effect, settled: tuple[str, ...], payload: dict[str, Any]
    ) -> None:
        """Refuse "not happened" from anyone but the owner until the grace after the lease ends."""
        grace = self.reconcile_grace_seconds
        if grace < 0:
            grace = await _lease_seconds(unit, principal.tenant_id, effect)
        settle_after = lifecycle.not_happened_settles_after(effect.attempts, settled, principal.principal_id, grace)
        if settle_after is None or settle_after <= unit.now:
            return
        message = (
            f"an attempt of another principal may still be in flight: not_happened is accepted from it "
            f"at any time, from others after {settle_after.isoformat()} (its lease end plus {grace:g} s)"
        )
        unit.record_event(
            principal.tenant_id, effect.run_id, "effect.reconcile_refused",
            {**payload, "refused_reason": "RECONCILE_TOO_EARLY", "settle_after": settle_after.isoformat()},
            principal.principal_id,
        )
        raise CommitThenRaise(
            FailedPrecondition(
                message,
                reason="RECONCILE_TOO_EARLY",
                violations=[PreconditionViolation("RECONCILE_TOO_EARLY", f"effect/{effect.effect_id}", message)],
                metadata={
                    "effect_id": effect.effect_id,
                    "stage": effect.stage.value,
                    "settle_after": settle_after.isoformat(),
                },
            )
        )

    # --- reads -----------------------------------------------------------------------------

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
        found = await repo.open_effects_of_run(
            unit.connection, principal.tenant_id, run_id, after_effect_id, page_size
        )
        return [e for e in await record_expiries(unit, principal.tenant_id, found) if e.stage in OPEN_STAGES]

    async def get_decision(self, unit: UnitOfWork, principal: Principal, decision_id: str) -> Decision:
        check_identifier(decision_id, "decision_id")
        decision = await repo.get_decision(unit.connection, principal.tenant_id, decision_id)
        if decision is None:
            raise NotFound("decision", decision_id)
        return decision


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
    refusals = []
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


def _refusal(reason: str, message: str, attempt: Attempt) -> FailedPrecondition:
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


async def sweep_expired_leases(unit: UnitOfWork, tenant_id: str, effect_id: str) -> int:
    """Record lease expiries of one effect (background sweeper); returns how many expired."""
    effect = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, tenant_id, effect_id))
    if effect is None:
        return 0
    return await expire_leases(unit, tenant_id, effect, SYSTEM_SWEEPER)
