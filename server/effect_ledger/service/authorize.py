"""AuthorizeEffect: the final gate (the general path; PostgreSQL's common cases take
``authorize_fast``). Everything it decides is written with the decision record and the trace
events in one unit of work, or not at all."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from effect_ledger.config import Limits
from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain import lifecycle
from effect_ledger.domain import schedules as schedule_rules
from effect_ledger.domain.approvals import Intent
from effect_ledger.domain.budgets import Budget
from effect_ledger.domain.canonical import canonical_bytes, intent_digest, parse_json, sha256_hex
from effect_ledger.domain.contracts import (
    check_identifier,
    check_target,
    check_tool_name,
)
from effect_ledger.domain.gate_rules import (
    IntentFacts,
    authorized_events,
    combine,
    expired_in_memory,
    run_refusals,
)
from effect_ledger.domain.lifecycle import LedgerVerdict, VerdictKind
from effect_ledger.domain.model import (
    Attempt,
    Decision,
    Effect,
    Outcome,
    Principal,
    Reason,
    Receipt,
    Run,
    Stage,
    ToolContract,
)
from effect_ledger.domain.policy_input import build_policy_input
from effect_ledger.domain.schedules import ScheduleState
from effect_ledger.errors import (
    CommitThenRaise,
    Conflict,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PreconditionViolation,
    Unavailable,
)
from effect_ledger.observability import calls
from effect_ledger.policy.engine import PolicyDecision, PolicyEngine
from effect_ledger.service import approvals, argument_checks, budgets, schedules
from effect_ledger.service.approvals import ApprovalSettings
from effect_ledger.service.leases import (
    adopt_clock,
    expire_leases,
)
from effect_ledger.storage import budget_store, checkpoint_store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork

LEDGER_ENGINE = "ledger"


# Tools with a schema this process remembers for early checks (least recently used forgotten).
SCHEMAS_KNOWN_MAX = 64


async def checked_arguments(contract: ToolContract, arguments: dict[str, Any], tenant_id: str) -> list[FieldViolation]:
    """The arguments' violations of the contract's schema, found by a worker process
    (``argument_checks``): the event loop serves every other call meanwhile."""
    return await argument_checks.CHECKER.violations(
        contract.arguments_schema, arguments, tenant_id, contract.tool, contract.revision
    )


class KnownSchemas:
    """The latest revision of each tenant's tool with an arguments schema, as earlier calls of
    this process read it (a revision never changes; a newer one may exist, which the unit of
    work finds)."""

    def __init__(self) -> None:
        self.schemas: OrderedDict[tuple[str, str], ToolContract] = OrderedDict()

    def learn(self, tenant_id: str, tool: str, current: ToolContract | None) -> None:
        key = (tenant_id, tool)
        if current is None or not current.arguments_schema:
            self.schemas.pop(key, None)
            return
        self.schemas[key] = current
        self.schemas.move_to_end(key)
        while len(self.schemas) > SCHEMAS_KNOWN_MAX:
            self.schemas.popitem(last=False)

    def latest(self, tenant_id: str, tool: str) -> ToolContract | None:
        return self.schemas.get((tenant_id, tool))


KNOWN = KnownSchemas()


@dataclass(frozen=True)
class EarlyCheck:
    """The arguments checked before AuthorizeEffect's unit of work began (which, on SQLite,
    holds the database's one write lock), against the schema of ``revision`` of the tool, the
    latest this process knew for the tenant the caller's token belonged to last time
    (``CallState.tenant_hint``). Inside the unit the result stands only for that tenant and that
    revision, still the latest; otherwise the check runs there as before. ``revision`` 0:
    nothing was checked early."""

    tenant_id: str = ""
    revision: int = 0
    violations: tuple[FieldViolation, ...] = ()
    refusal: InvalidArgument | FailedPrecondition | None = None


async def early_check(request: AuthorizeRequest, arguments: dict[str, Any]) -> EarlyCheck:
    """Check the arguments now if this process knows the caller's tenant (the guard's hint) and
    the schema of its tool's latest revision (learned from earlier calls); no database read."""
    state = calls.current.get()
    tenant_id = state.tenant_hint if state is not None else ""
    contract = KNOWN.latest(tenant_id, request.tool) if tenant_id else None
    if contract is None:
        return EarlyCheck()
    try:
        violations = await checked_arguments(contract, arguments, tenant_id)
    except Unavailable:
        return EarlyCheck()  # checked (or refused) inside the unit, as before
    except (InvalidArgument, FailedPrecondition) as refusal:
        return EarlyCheck(tenant_id, contract.revision, refusal=refusal)
    return EarlyCheck(tenant_id, contract.revision, tuple(violations))


async def schema_verdict(
    current: ToolContract, arguments: dict[str, Any], tenant_id: str, early: EarlyCheck | None
) -> None:
    """Refuse arguments that do not satisfy ``current``'s schema (a new effect only): the early
    check's result when it was made for this tenant and this revision, otherwise a check now."""
    if early is not None and early.revision == current.revision and early.tenant_id == tenant_id:
        if early.refusal is not None:
            raise early.refusal
        violations = list(early.violations)
    else:
        violations = await checked_arguments(current, arguments, tenant_id)
    if violations:
        raise InvalidArgument(
            "the arguments do not satisfy the tool's arguments schema",
            reason="ARGUMENTS_SCHEMA_VIOLATION",
            violations=violations,
        )


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
    schedule_id: str = ""


def validate_authorize(request: AuthorizeRequest, limits: Limits) -> dict[str, Any]:
    """Input checks that need no database; returns the parsed arguments."""
    check_identifier(request.run_id, "run_id")
    check_tool_name(request.tool)
    check_identifier(request.idempotency_key, "idempotency_key")
    check_target(request.target)
    return parse_json(request.arguments_json, field="arguments_json", size_max_bytes=limits.arguments_size_max_bytes)


def policy_input_of(
    now: Any,
    principal: Principal,
    request: AuthorizeRequest,
    arguments: dict[str, Any],
    facts: IntentFacts,
    estimate: dict[str, int],
    applicable: list[Budget],
    run_open: list[dict[str, Any]],
    on_target: list[dict[str, Any]],
    approval_facts: list[dict[str, Any]],
    limits: Limits,
) -> dict[str, Any]:
    """The policy input from facts read from the ledger (by either path)."""
    effect = facts.effect
    return build_policy_input(
        now=now,
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
        run_open_effects_limit=limits.run_open_effects_in_policy_max,
        target_unknown_effects=[item for item in on_target if effect is None or item["effect_id"] != effect.effect_id][
            : limits.target_unknown_effects_in_policy_max
        ],
        estimate=estimate,
        requested_estimate=request.estimate,
        budgets=[budget.as_policy_fact(estimate.get(budget.dimension, 0)) for budget in applicable],
        approvals=approval_facts,
        pending_reconciliation=facts.obligations,
    )


async def decide(
    policy: PolicyEngine,
    principal: Principal,
    request: AuthorizeRequest,
    facts: IntentFacts,
    policy_input: dict[str, Any],
    now: Any,
) -> tuple[Decision, PolicyDecision]:
    """Evaluate policy on the input (the engine and the decision record get the same bytes) and
    combine its answer with the ledger's verdict into the decision to record."""
    input_bytes = canonical_bytes(policy_input)
    policy_decision = await policy.evaluate(policy_input, input_bytes)
    outcome, reasons = combine(
        facts.verdict,
        policy_decision.outcome,
        policy_decision.reasons,
        facts.current,
        facts.pinned,
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
        created_at=now,
    )
    return decision, policy_decision


class Authorizer:
    """Gate's AuthorizeEffect (a part of ``Gate``)."""

    policy: PolicyEngine
    limits: Limits
    approval_settings: ApprovalSettings

    async def authorize(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        early: EarlyCheck | None = None,
    ) -> AuthorizeResult:
        facts = await self._intent_facts(unit, principal, request, arguments, early)
        if facts.verdict.kind == VerdictKind.KEY_REUSED:
            await self._refuse_reused_key(unit, principal, request, facts.effect, facts.digest, facts.verdict)
        schedule = await schedules.for_gate(unit, principal.tenant_id, request.idempotency_key)
        schedule_refusal = schedule_rules.gate_refusal(schedule, unit.now)
        if schedule_refusal is not None:
            facts = replace(facts, schedule_refusal=schedule_refusal)
        elif schedule is not None:
            # Due: reconsidered now, under the policy current now; what it held is given back
            # first, so that the attempt (if any) reserves its own estimate in its place (the
            # schedule's close below then finds nothing left to release).
            await budgets.release_holder(unit, principal.tenant_id, schedule.schedule_id)
        contract = facts.pinned or facts.current
        wanted = budget_rules.merged_estimate(request.estimate, contract.default_estimate if contract else {})
        estimate = budget_rules.validate_amounts(
            wanted, "estimate", await budgets.dimensions_for(unit, principal.tenant_id, wanted)
        )
        applicable = await budget_store.applicable_budgets(
            unit.connection, principal.tenant_id, facts.run.run_id, facts.run.root_run_id, unit.now
        )
        policy_input = await self._policy_input(unit, principal, request, arguments, facts, estimate, applicable)
        decision, policy_decision = await decide(self.policy, principal, request, facts, policy_input, unit.now)
        outcome = decision.outcome
        admitted = Admission(facts.effect, None, "", (), "")
        if outcome == Outcome.ALLOW:
            admitted = await self._admit(
                unit,
                principal,
                request,
                arguments,
                facts,
                policy_decision,
                estimate,
                applicable,
                decision.decision_id,
                policy_input["approvals"],
            )
            if admitted.refusal:
                decision = replace(decision, outcome=Outcome.DENY, reasons=admitted.refusal)
            else:
                assert admitted.effect is not None and admitted.attempt is not None, "an admission without refusal"
                decision = replace(
                    decision, effect_id=admitted.effect.effect_id, attempt_id=admitted.attempt.attempt_id
                )
        elif outcome == Outcome.REQUIRE_APPROVAL:
            requested = await approvals.ensure_request(
                unit,
                principal,
                facts.intent,
                request.target,
                arguments,
                quorum=policy_decision.quorum,
                reusable=False,
                reason="the gate answered REQUIRE_APPROVAL",
                ttl_seconds=self.approval_settings.ttl_seconds_default,
                open_max=self.approval_settings.open_requests_per_tenant_max,
            )
            admitted = replace(admitted, approval_request_id=requested.approval_id)
        await repo.insert_decision(unit.connection, principal.tenant_id, decision)
        if schedule is not None and schedule_refusal is None:
            await schedules.close(
                unit,
                principal.tenant_id,
                schedule,
                ScheduleState.CONSUMED,
                principal.principal_id,
                f"reconsidered: {decision.outcome.value}",
                decision.decision_id,
            )
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
            schedule_id=schedule.schedule_id if schedule is not None else "",
        )

    async def _intent_facts(
        self,
        unit: UnitOfWork,
        principal: Principal,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        early: EarlyCheck | None,
    ) -> IntentFacts:
        """The run, the effect bound to the key (leases expired), the contracts, the digest, the verdict."""
        tenant = principal.tenant_id
        connection = unit.connection
        run = await repo.get_run(connection, tenant, request.run_id)
        if run is None:
            raise NotFound("run", request.run_id)
        effect = adopt_clock(unit, await repo.lock_effect_by_key(connection, tenant, request.idempotency_key))
        current = await repo.latest_contract(connection, tenant, request.tool)
        KNOWN.learn(tenant, request.tool, current)
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
            await schema_verdict(current, arguments, tenant, early)
        if effect is None and run.parent_run_id:
            effect, verdict = await self._ancestor_verdict(unit, tenant, run, request, arguments, verdict)
            if effect is not None:
                # Judged under the revision the ancestor's effect is pinned to, like a retry of its key.
                pinned = await repo.contract_revision(connection, tenant, effect.tool, effect.tool_revision)
                revision, digest = effect.tool_revision, effect.intent_digest
        intent = Intent(run.run_id, request.tool, revision, digest)
        obligations = tuple(await checkpoint_store.outstanding_obligations(connection, tenant, run.run_id))
        return IntentFacts(
            run,
            effect,
            current,
            pinned if effect is not None else current,
            revision,
            digest,
            verdict,
            intent,
            obligations,
        )

    async def _ancestor_verdict(
        self,
        unit: UnitOfWork,
        tenant: str,
        run: Run,
        request: AuthorizeRequest,
        arguments: dict[str, Any],
        verdict: LedgerVerdict,
    ) -> tuple[Effect | None, LedgerVerdict]:
        """A fork sees the effects of the runs it came from and never re-executes them."""
        chain: list[str] = []
        current_run: Run | None = run
        while current_run is not None and current_run.parent_run_id and len(chain) < 16:
            chain.append(current_run.parent_run_id)
            current_run = await repo.get_run(unit.connection, tenant, current_run.parent_run_id)
        found = await checkpoint_store.ancestor_effect(
            unit.connection,
            tenant,
            chain,
            request.tool,
            request.target,
            lambda revision: intent_digest(
                tool=request.tool, tool_revision=revision, target=request.target, arguments=arguments
            ),
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
        run_open, on_target = await repo.effects_for_policy(
            unit.connection,
            principal.tenant_id,
            facts.run.run_id,
            request.tool,
            request.target,
            self.limits.run_open_effects_in_policy_max,
            self.limits.target_unknown_effects_in_policy_max + 1,
        )
        return policy_input_of(
            unit.now,
            principal,
            request,
            arguments,
            facts,
            estimate,
            applicable,
            run_open,
            on_target,
            await approvals.facts_for_intent(unit, principal, facts.intent),
            self.limits,
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
            approval, problems = await approvals.usable_approval(
                unit, principal, policy_decision.approval_id, facts.intent
            )
            if problems:
                seen = next((a for a in approval_facts if a["approval_id"] == policy_decision.approval_id), None)
                if seen is not None and not seen["binding_problems"]:
                    # It bound the intent when the facts were read and does not under the lock: a
                    # concurrent transaction used (or revoked) it in between. Run again, so the
                    # answer comes from what that transaction committed.
                    raise Conflict("the approval changed concurrently")
                refusal = tuple(Reason(code, f"approval {policy_decision.approval_id}") for code in problems)
                return Admission(
                    facts.effect,
                    None,
                    "",
                    (),
                    "",
                    (Reason("APPROVAL_INVALID", "the approval policy relied on does not bind this intent"),) + refusal,
                )
        effect_id = facts.effect.effect_id if facts.effect is not None else repo.new_id("eff")
        attempt_id = repo.new_id("att")
        reservation_ids, exhausted = await budgets.reserve(
            unit, principal.tenant_id, applicable, estimate, attempt_id, effect_id
        )
        if exhausted is not None:
            return Admission(
                facts.effect,
                None,
                "",
                (),
                "",
                (Reason("BUDGET_EXHAUSTED", f"dimension {exhausted}: the estimate does not fit in the budget"),),
            )
        effect, attempt = await self._create_attempt(
            unit,
            principal,
            request,
            arguments,
            facts.digest,
            facts.pinned,
            facts.effect,
            facts.verdict,
            decision_id,
            effect_id,
            attempt_id,
            approval.approval_id if approval else "",
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
        facts = {
            "idempotency_key": request.idempotency_key,
            "bound_digest": effect.intent_digest,
            "request_digest": digest,
        }
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
                metadata={
                    "effect_id": effect.effect_id,
                    "decision_id": decision_id,
                    "bound_digest": effect.intent_digest,
                },
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
