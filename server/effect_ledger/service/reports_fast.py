"""Reports about an attempt on PostgreSQL (RecordDispatch, RecordOutcome, ReleaseAttempt,
RenewLease): read once, decide, write once.

One round trip reads the attempt's effect (locked first, then read, then the clock), its
attempts, its pinned contract and its pending reservations (``gate_store.attempt_facts``); the
report is judged here by the same rules as ``Gate.report``; one round trip writes the result
and commits (``gate_store.apply``). ``Fallback`` hands over to the general path, before
anything is written, what this one does not handle: a lease to record as expired, siblings
deduplicated under a shared provider key, usage posted beyond what was reserved, a custom
usage dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain import lifecycle
from effect_ledger.domain.budgets import ReservationState
from effect_ledger.domain.contracts import check_identifier, is_identifier
from effect_ledger.domain.gate_rules import foreign_attempts, not_owned
from effect_ledger.domain.lifecycle import Report
from effect_ledger.domain.model import (
    OPEN_STAGES,
    Attempt,
    Effect,
    Principal,
    Role,
    Stage,
    ToolContract,
)
from effect_ledger.errors import NotFound
from effect_ledger.service.attempts import AttemptResult, attempt_refusal, report_payload
from effect_ledger.service.authorize_fast import Fallback, authenticated
from effect_ledger.service.gate import Gate
from effect_ledger.storage import gate_store


@dataclass(frozen=True)
class AttemptFacts:
    principal: Principal
    now: datetime
    effect: Effect
    attempt: Attempt
    pinned: ToolContract | None
    reservations: list[dict[str, Any]]


async def _facts(
    connection: Any, token_hash: str, roles: frozenset[Role], attempt_id: str, peer_subject: str | None
) -> AttemptFacts:
    if not is_identifier(attempt_id):
        # Never sent to the database (a NUL is not text there); the general path authenticates
        # the caller first and then refuses the id.
        raise Fallback("a malformed attempt id: the general path refuses it")
    document = await gate_store.attempt_facts(connection, token_hash, attempt_id)
    row = document["principal"]
    principal = authenticated(gate_store.principal_of(row) if row else None, roles, peer_subject)
    check_identifier(attempt_id, "attempt_id")
    if document.get("effect") is None:
        raise NotFound("attempt", attempt_id)
    now = gate_store.required_time(document["now"])
    effect = gate_store.effect_of(document["effect"], document["attempts"])
    assert effect is not None
    attempt = next(a for a in effect.attempts if a.attempt_id == attempt_id)
    if foreign_attempts(principal, [attempt]):
        raise not_owned(principal, [attempt_id])
    if any(lifecycle.lease_expired(a, now) for a in effect.attempts):
        raise Fallback("a lease ran out: the general path records the expiry")
    return AttemptFacts(
        principal, now, effect, attempt, gate_store.contract_of(document["pinned"]), document["reservations"]
    )


def _plan(facts: AttemptFacts) -> dict[str, Any]:
    return {"tenant_id": facts.principal.tenant_id, "run_id": facts.effect.run_id, "now": facts.now.isoformat()}


def _event(facts: AttemptFacts, event_type: str, payload: dict[str, Any]) -> dict[str, str]:
    return gate_store.event_item(
        facts.principal.tenant_id, facts.effect.run_id, event_type, payload, facts.principal.principal_id, facts.now
    )


async def report(
    gate: Gate,
    connection: Any,
    token_hash: str,
    roles: frozenset[Role],
    attempt_id: str,
    make_report: Callable[[datetime], Report],
    peer_subject: str | None = None,
) -> AttemptResult:
    """As ``Gate.report``; ``make_report`` builds the report at the clock read under the lock."""
    facts = await _facts(connection, token_hash, roles, attempt_id, peer_subject)
    report = make_report(facts.now)
    if report.usage:
        if not set(report.usage) <= budget_rules.STANDARD_DIMENSIONS:
            raise Fallback("a custom usage dimension: the general path checks it")
        usage = budget_rules.validate_amounts(
            report.usage, "succeeded.usage", budget_rules.STANDARD_DIMENSIONS, keep_zero=True
        )
        assert facts.pinned is not None, "an effect's pinned contract revision is never deleted"
        # Usage below the contract's floor posts the floor: the caller cannot lower its count.
        report = replace(report, usage=budget_rules.floored_usage(usage, facts.pinned.default_estimate))
    effect, attempt = facts.effect, facts.attempt
    transition = lifecycle.apply_report(attempt, report, facts.now)
    payload = report_payload(effect, attempt, report)
    plan = _plan(facts)
    if transition.refused:
        plan["events"] = [
            _event(facts, "attempt.report_refused", {**payload, "refused_reason": transition.refused_reason})
        ]
        await gate_store.apply(connection, plan, b"")
        raise attempt_refusal(transition.refused_reason, transition.refused_message, attempt)
    if not transition.applied:
        if report.kind.value != attempt.stage.value:
            plan["events"] = [_event(facts, "attempt.report_superseded", payload)]
            await gate_store.apply(connection, plan, b"")
        return AttemptResult(attempt, effect.stage, changed=False)
    stage = transition.stage
    if stage == Stage.SUCCEEDED and any(
        a.attempt_id != attempt.attempt_id and a.stage in OPEN_STAGES and a.provider_key == attempt.provider_key
        for a in effect.attempts
    ):
        raise Fallback("siblings under a shared provider key: the general path settles them")
    attempt.stage = stage
    if stage == Stage.DISPATCHED:
        attempt.dispatched_at = facts.now
        # The lease restarts at dispatch, so a long call can heartbeat from here.
        assert facts.pinned is not None, "an effect's pinned contract revision is never deleted"
        attempt.lease_expires_at = lifecycle.lease_until(facts.now, facts.pinned.lease_seconds)
    else:
        attempt.finished_at = facts.now
        attempt.outcome_reason = report.reason
        attempt.failure_evidence = report.failure_evidence
        attempt.receipt = report.receipt
    effect.stage = lifecycle.effect_stage(effect.attempts)
    effect.updated_at = facts.now
    plan["settlements"] = _settlements(facts, stage, report.usage)
    plan["effect_state"] = {"effect_id": effect.effect_id, "stage": effect.stage.value}
    plan["attempt_updates"] = [gate_store.attempt_row(facts.principal.tenant_id, attempt)]
    plan["events"] = [_event(facts, f"attempt.{stage.value.lower()}", {**payload, "stage": stage.value})]
    try:
        await gate_store.apply(connection, plan, b"")
    except gate_store.CounterOverflow as overflow:
        raise Fallback("a posting would overflow a budget counter: the general path names the field") from overflow
    return AttemptResult(attempt, effect.stage, changed=True)


def _settlements(facts: AttemptFacts, stage: Stage, usage: dict[str, int] | None) -> list[dict[str, Any]]:
    """The money follows the outcome: SUCCEEDED posts, a definite no voids, UNKNOWN holds."""
    if stage not in (Stage.SUCCEEDED, Stage.FAILED, Stage.RELEASED):
        return []
    pending = [r for r in facts.reservations if r["attempt_id"] == facts.attempt.attempt_id]
    if stage == Stage.SUCCEEDED and usage and set(usage) - {r["dimension"] for r in pending}:
        raise Fallback("usage beyond what was reserved: the general path posts it to the run's budgets")
    settlements = []
    for reservation in pending:
        if stage == Stage.SUCCEEDED:
            posted = (
                usage[reservation["dimension"]]
                if usage and reservation["dimension"] in usage
                else reservation["amount"]
            )
            state = ReservationState.POSTED
        else:
            posted, state = 0, ReservationState.VOIDED
        settlements.append(
            {
                "reservation_id": reservation["reservation_id"],
                "budget_id": reservation["budget_id"],
                "amount": reservation["amount"],
                "posted_amount": posted,
                "state": state.value,
            }
        )
    return settlements


async def renew_lease(
    gate: Gate,
    connection: Any,
    token_hash: str,
    roles: frozenset[Role],
    attempt_id: str,
    peer_subject: str | None = None,
) -> AttemptResult:
    """As ``Gate.renew_lease``."""
    facts = await _facts(connection, token_hash, roles, attempt_id, peer_subject)
    attempt = facts.attempt
    if attempt.stage == Stage.UNKNOWN:
        raise attempt_refusal("LEASE_EXPIRED", "the lease ran out; the attempt is UNKNOWN now", attempt)
    if attempt.stage not in (Stage.AUTHORIZED, Stage.DISPATCHED):
        raise attempt_refusal("ATTEMPT_NOT_OPEN", f"the attempt is {attempt.stage.value}", attempt)
    assert facts.pinned is not None, "an effect's pinned contract revision is never deleted"
    attempt.lease_expires_at = lifecycle.lease_until(facts.now, facts.pinned.lease_seconds)
    plan = _plan(facts)
    plan["attempt_updates"] = [gate_store.attempt_row(facts.principal.tenant_id, attempt)]
    await gate_store.apply(connection, plan, b"")
    return AttemptResult(attempt, facts.effect.stage, changed=True)
