"""AuthorizeEffect on PostgreSQL: read once, decide, write once.

One round trip reads every fact (``gate_store.authorize_facts``, the effect locked first and
the clock read after the lock), the decision is made here with the same rules as the general
path (``Gate.authorize``: the ledger's verdict, the policy input, policy, ``combine``), and one
round trip writes it and commits (``gate_store.apply``). The general path stays for
what this one does not handle; ``Fallback`` hands the call over to it before anything is
written: a lease to record as expired, approvals on the run for the tool, a scheduled intent of
the key, a fork's ancestors, a budget period to roll over, a reused key, REQUIRE_APPROVAL.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain import lifecycle
from effect_ledger.domain.approvals import Intent
from effect_ledger.domain.budgets import Budget, ReservationState
from effect_ledger.domain.canonical import intent_digest
from effect_ledger.domain.gate_rules import IntentFacts, authorized_events
from effect_ledger.domain.lifecycle import VerdictKind
from effect_ledger.domain.model import (
    Attempt,
    Decision,
    Effect,
    Outcome,
    Principal,
    Reason,
    Role,
    Stage,
)
from effect_ledger.domain.tokens import check_certificate_binding
from effect_ledger.errors import NotFound, PermissionDenied, Unauthenticated
from effect_ledger.observability import calls
from effect_ledger.service.authorize import (
    KNOWN,
    AuthorizeRequest,
    AuthorizeResult,
    EarlyCheck,
    decide,
    policy_input_of,
    schema_verdict,
)
from effect_ledger.service.gate import Gate
from effect_ledger.storage import gate_store
from effect_ledger.storage import repository as repo

EXHAUSTED_PLACEHOLDER = (Reason("BUDGET_EXHAUSTED", ""),)


class Fallback(Exception):
    """This call needs the general path; nothing was written."""


def authenticated(principal: Principal | None, roles: frozenset[Role], peer_subject: str | None) -> Principal:
    """The caller, as ``Application.call`` checks it: a known, enabled token, from the client
    certificate it is bound to (if any), with a role."""
    if principal is None:
        raise Unauthenticated("unknown or disabled token", reason="TOKEN_UNKNOWN")
    check_certificate_binding(principal, peer_subject)
    calls.identify(principal.tenant_id, principal.principal_id)  # for the call's access line
    if not principal.has_any(roles):
        raise PermissionDenied(
            f"needs one of the roles {sorted(r.value for r in roles)}",
            reason="ROLE_REQUIRED",
            metadata={"principal_id": principal.principal_id},
        )
    return principal


async def _intent_facts(
    facts: gate_store.AuthorizeFacts,
    request: AuthorizeRequest,
    arguments: dict[str, Any],
    tenant_id: str,
    early: EarlyCheck | None,
) -> IntentFacts:
    """As ``Gate._intent_facts``, from facts already read."""
    run, effect, current = facts.run, facts.effect, facts.current
    assert run is not None and facts.now is not None
    KNOWN.learn(tenant_id, request.tool, current)
    if effect is not None:
        if any(lifecycle.lease_expired(attempt, facts.now) for attempt in effect.attempts):
            raise Fallback("a lease ran out: the general path records the expiry")
        same = current is not None and current.tool == effect.tool and current.revision == effect.tool_revision
        pinned = current if same else facts.pinned
        revision = effect.tool_revision
    else:
        if run.parent_run_id:
            raise Fallback("a fork: the general path looks for the effect in its ancestors")
        pinned = current
        revision = current.revision if current is not None else 0
    digest = intent_digest(tool=request.tool, tool_revision=revision, target=request.target, arguments=arguments)
    verdict = lifecycle.ledger_verdict(effect, pinned, digest)
    if verdict.kind == VerdictKind.KEY_REUSED:
        raise Fallback("a reused key: the general path records the refusal")
    if verdict.kind == VerdictKind.NEW_EFFECT and current is not None and current.arguments_schema:
        await schema_verdict(current, arguments, tenant_id, early)
    intent = Intent(run.run_id, request.tool, revision, digest)
    return IntentFacts(
        run,
        effect,
        current,
        pinned if effect is not None else current,
        revision,
        digest,
        verdict,
        intent,
        facts.obligations,
    )


async def authorize(
    gate: Gate,
    connection: Any,
    token_hash: str,
    roles: frozenset[Role],
    request: AuthorizeRequest,
    arguments: dict[str, Any],
    peer_subject: str | None = None,
    early: EarlyCheck | None = None,
) -> AuthorizeResult:
    limits = gate.limits
    custom = bool(set(request.estimate) - budget_rules.STANDARD_DIMENSIONS)
    facts = await gate_store.authorize_facts(
        connection,
        token_hash,
        request.run_id,
        request.idempotency_key,
        request.tool,
        request.target,
        limits.run_open_effects_in_policy_max,
        limits.target_unknown_effects_in_policy_max + 1,
        custom,
    )
    principal = authenticated(facts.principal, roles, peer_subject)
    if facts.run is None:
        raise NotFound("run", request.run_id)
    if facts.has_approvals:
        raise Fallback("approvals exist for this tool on the run: the general path binds them")
    if facts.has_schedule:
        raise Fallback("the key has an open scheduled intent: the general path judges and consumes it")
    now = facts.now
    assert now is not None
    intent = await _intent_facts(facts, request, arguments, principal.tenant_id, early)
    if any(b.period_ends_at is not None and b.period_ends_at <= now for b in facts.budgets):
        raise Fallback("a budget period ended: the general path rolls it over")
    contract = intent.pinned or intent.current
    wanted = budget_rules.merged_estimate(request.estimate, contract.default_estimate if contract else {})
    known = budget_rules.STANDARD_DIMENSIONS
    if not set(wanted) <= known:
        if facts.dimensions is None:
            raise Fallback("the contract's default estimate names a custom dimension")
        known = known | facts.dimensions
    estimate = budget_rules.validate_amounts(wanted, "estimate", known)
    effect = intent.effect
    policy_input = policy_input_of(
        now, principal, request, arguments, intent, estimate, facts.budgets, facts.run_open, facts.on_target, [], limits
    )
    decision, policy_decision = await decide(gate.policy, principal, request, intent, policy_input, now)
    outcome = decision.outcome
    if outcome == Outcome.REQUIRE_APPROVAL or (outcome == Outcome.ALLOW and policy_decision.approval_id):
        raise Fallback("approvals: the general path files or binds them")
    input_bytes = decision.input_json
    tenant = principal.tenant_id
    plan: dict[str, Any] = {"tenant_id": tenant, "run_id": intent.run.run_id, "now": now.isoformat()}
    attempt: Attempt | None = None
    reservation_ids: tuple[str, ...] = ()
    if outcome == Outcome.ALLOW:
        effect, attempt, reservation_ids = _admit(
            plan, principal, request, arguments, intent, estimate, facts.budgets, decision
        )
        plan["exhausted_decision"] = gate_store.decision_row(
            tenant, replace(decision, outcome=Outcome.DENY, reasons=EXHAUSTED_PLACEHOLDER)
        )
        decision = replace(decision, effect_id=effect.effect_id, attempt_id=attempt.attempt_id)
    plan["decision"] = gate_store.decision_row(tenant, decision)
    written = await gate_store.apply(connection, plan, input_bytes)
    if written.get("exhausted"):
        dimension = written["exhausted"]
        refusal = (Reason("BUDGET_EXHAUSTED", f"dimension {dimension}: the estimate does not fit in the budget"),)
        effect, attempt, reservation_ids = intent.effect, None, ()
        decision = replace(
            decision,
            outcome=Outcome.DENY,
            reasons=refusal,
            effect_id=effect.effect_id if effect is not None else None,
            attempt_id=None,
        )
    return AuthorizeResult(
        outcome=decision.outcome,
        effect_id=effect.effect_id if effect is not None else "",
        attempt=attempt,
        intent_digest=intent.digest,
        reasons=decision.reasons,
        decision_id=decision.decision_id,
        policy_revision=policy_decision.revision,
        receipt=effect.receipt if (effect is not None and decision.outcome == Outcome.DUPLICATE) else None,
        tool_revision=intent.revision,
        effect_stage=effect.stage if effect is not None else None,
        reservation_ids=reservation_ids,
    )


def _admit(
    plan: dict[str, Any],
    principal: Principal,
    request: AuthorizeRequest,
    arguments: dict[str, Any],
    intent: IntentFacts,
    estimate: dict[str, int],
    applicable: list[Budget],
    decision: Decision,
) -> tuple[Effect, Attempt, tuple[str, ...]]:
    """The effect, attempt, reservations and events an ALLOW writes, added to the plan."""
    assert intent.pinned is not None  # combine() never allows without a contract
    tenant, now = principal.tenant_id, decision.created_at
    contract = intent.pinned
    existing = intent.effect
    dispatched = request.begin_dispatched
    effect_id = existing.effect_id if existing is not None else repo.new_id("eff")
    attempt_id = repo.new_id("att")
    if existing is None:
        effect = Effect(
            effect_id=effect_id,
            run_id=request.run_id,
            tool=request.tool,
            tool_revision=contract.revision,
            target=request.target,
            idempotency_key=request.idempotency_key,
            intent_digest=intent.digest,
            arguments=arguments,
            stage=Stage.AUTHORIZED,
            created_at=now,
            updated_at=now,
        )
    else:
        effect = replace(existing, attempts=list(existing.attempts))
    attempt = Attempt(
        attempt_id=attempt_id,
        effect_id=effect_id,
        number=len(effect.attempts) + 1,
        stage=Stage.DISPATCHED if dispatched else Stage.AUTHORIZED,
        provider_key=lifecycle.provider_key_for_new_attempt(
            effect_id, effect.attempts, intent.verdict.reuse_provider_key
        ),
        provider_key_reused=intent.verdict.reuse_provider_key,
        lease_expires_at=lifecycle.lease_until(now, contract.lease_seconds),
        authorized_at=now,
        decision_id=decision.decision_id,
        dispatched_at=now if dispatched else None,
        principal_id=principal.principal_id,
    )
    effect.attempts.append(attempt)
    effect.stage = lifecycle.effect_stage(effect.attempts)
    effect.updated_at = now
    if existing is None:
        plan["new_effect"] = gate_store.effect_row(tenant, effect)
    else:
        plan["effect_state"] = {"effect_id": effect_id, "stage": effect.stage.value}
    plan["attempt"] = gate_store.attempt_row(tenant, attempt)
    reservations = []
    rows: list[dict[str, Any]] = []
    for budget, amount in budget_rules.reservations_needed(applicable, estimate):
        reservation_id = repo.new_id("res")
        reservations.append({"budget_id": budget.budget_id, "amount": amount, "dimension": budget.dimension})
        rows.append(
            {
                "tenant_id": tenant,
                "reservation_id": reservation_id,
                "budget_id": budget.budget_id,
                "attempt_id": attempt_id,
                "effect_id": effect_id,
                "dimension": budget.dimension,
                "amount": amount,
                "state": ReservationState.PENDING.value,
                "posted_amount": 0,
                "created_at": now.isoformat(),
                "settled_at": None,
            }
        )
    plan["reservations"] = reservations
    plan["reservation_rows"] = rows
    plan["events"] = [
        gate_store.event_item(tenant, effect.run_id, event_type, payload, principal.principal_id, now)
        for event_type, payload in authorized_events(effect, attempt, existing is None, decision.decision_id, "")
    ]
    return effect, attempt, tuple(row["reservation_id"] for row in rows)
