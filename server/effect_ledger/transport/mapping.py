"""Protobuf <-> domain, in one place. Nothing else touches generated messages' fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from effect_ledger.domain import canonical
from effect_ledger.domain.model import (
    Attempt,
    Decision,
    Effect,
    EffectClass,
    FailureEvidence,
    Outcome,
    Reason,
    Receipt,
    Recovery,
    Run,
    RunEvent,
    Stage,
    ToolContract,
)
from effect_ledger.domain.retention import Tombstone
from effect_ledger.domain.schemas import SCHEMA_SIZE_MAX_BYTES
from effect_ledger.errors import InvalidArgument
from effect_ledger.service.attempts import AttemptResult
from effect_ledger.service.authorize import AuthorizeResult
from effect_ledger.service.replay import Replay
from effectledger.v1 import common_pb2, gate_pb2, retention_pb2, runs_pb2, tools_pb2


def timestamp(moment: datetime | None) -> Timestamp | None:
    if moment is None:
        return None
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def enum_value(enum_type: Any, value: int, field: str, domain: Any = None, *, required: bool = True) -> Any:
    """The request's enum number as its name, or as the member of ``domain`` of that name.

    Every enum number a request carries is converted here: 0 (unset) is FIELD_REQUIRED when
    ``required`` and None otherwise; a number the enum does not define, or a name the domain
    does not know, is INVALID_ENUM. Both are INVALID_ARGUMENT with a field violation.
    """
    if value == 0:
        if not required:
            return None
        raise InvalidArgument.field(field, "is required", reason="FIELD_REQUIRED")
    try:
        name = enum_type.Name(value)
        return domain(name) if domain is not None else name
    except ValueError:
        raise InvalidArgument.field(field, f"unknown value {value}", reason="INVALID_ENUM") from None


# --- tool contracts ------------------------------------------------------------------------


def contract_from_proto(message: tools_pb2.ToolContract) -> ToolContract:
    schema = canonical.parse_json(
        message.arguments_schema_json,
        field="contract.arguments_schema_json",
        size_max_bytes=SCHEMA_SIZE_MAX_BYTES,  # the domain's limit, checked again there
        allow_empty=True,
    )
    recovery = tuple(
        enum_value(common_pb2.Recovery, value, f"contract.allowed_recovery[{index}]", Recovery)
        for index, value in enumerate(message.allowed_recovery)
    )
    return ToolContract(
        tool=message.tool,
        revision=0,
        effect_class=enum_value(common_pb2.EffectClass, message.effect_class, "contract.effect_class", EffectClass),
        provider_idempotency=message.provider_idempotency,
        queryable=message.queryable,
        allowed_recovery=recovery,
        arguments_schema=schema,
        max_attempts=message.max_attempts,
        lease_seconds=message.lease_seconds,
        default_estimate=dict(message.default_estimate),
        simulator=message.simulator,
    )


def contract_to_proto(contract: ToolContract) -> tools_pb2.ToolContract:
    return tools_pb2.ToolContract(
        tool=contract.tool,
        revision=contract.revision,
        effect_class=common_pb2.EffectClass.Value(contract.effect_class.value),
        provider_idempotency=contract.provider_idempotency,
        queryable=contract.queryable,
        allowed_recovery=[common_pb2.Recovery.Value(r.value) for r in contract.allowed_recovery],
        arguments_schema_json=(
            canonical.canonical_bytes(contract.arguments_schema) if contract.arguments_schema is not None else b""
        ),
        max_attempts=contract.max_attempts,
        lease_seconds=contract.lease_seconds,
        retired=contract.retired,
        created_at=timestamp(contract.created_at),
        created_by=contract.created_by,
        retired_reason=contract.retired_reason,
        default_estimate=contract.default_estimate,
        simulator=contract.simulator,
    )


# --- runs ----------------------------------------------------------------------------------


def run_to_proto(run: Run) -> runs_pb2.Run:
    return runs_pb2.Run(
        run_id=run.run_id,
        created_by=run.created_by,
        created_at=timestamp(run.created_at),
        revision=run.revision,
        head_hash=run.head_hash,
        labels=run.labels,
        parent_run_id=run.parent_run_id or "",
        root_run_id=run.root_run_id,
        world=run.world,
        forked_from_checkpoint=run.forked_from_checkpoint or "",
        segment=run.segment,
        provider=run.provider,
        model=run.model,
        adapter=run.adapter,
    )


def event_to_proto(event: RunEvent) -> runs_pb2.RunEvent:
    return runs_pb2.RunEvent(
        run_id=event.run_id,
        revision=event.revision,
        type=event.type,
        payload_json=canonical.canonical_bytes(event.payload),
        principal_id=event.principal_id,
        created_at=timestamp(event.created_at),
        prev_hash=event.prev_hash,
        hash=event.hash,
        removed_by_retention=(
            tombstone_to_proto(event.removed_by_retention) if event.removed_by_retention is not None else None
        ),
    )


def tombstone_to_proto(tombstone: Tombstone) -> retention_pb2.RetentionTombstone:
    return retention_pb2.RetentionTombstone(
        tombstone_id=tombstone.tombstone_id,
        kind=retention_pb2.RetentionKind.Value(tombstone.kind.value),
        subject=tombstone.subject,
        material_digest=tombstone.material_digest,
        rule_max_age_seconds=tombstone.rule_max_age_seconds,
        removed_at=timestamp(tombstone.removed_at),
        removed_by=tombstone.removed_by,
    )


# --- the gate ------------------------------------------------------------------------------


def stage_value(stage: Stage | None) -> Any:
    """The proto enum number (typed Any: the generated stubs want their own enum type)."""
    return common_pb2.Stage.Value(stage.value) if stage is not None else 0


def reason_to_proto(reason: Reason) -> common_pb2.Reason:
    return common_pb2.Reason(code=reason.code, message=reason.message)


def receipt_to_proto(receipt: Receipt | None) -> common_pb2.Receipt | None:
    if receipt is None:
        return None
    return common_pb2.Receipt(
        provider_reference=receipt.provider_reference,
        detail_json=canonical.canonical_bytes(receipt.detail),
        digest=receipt.digest,
        recorded_at=timestamp(receipt.recorded_at),
    )


def evidence_value(evidence: FailureEvidence | None) -> Any:
    """The proto enum number (typed Any: the generated stubs want their own enum type)."""
    return gate_pb2.FailureEvidence.Value(evidence.value) if evidence else 0


def failure_evidence(value: int) -> FailureEvidence:
    return enum_value(gate_pb2.FailureEvidence, value, "failed.evidence", FailureEvidence)


def authorize_response(result: AuthorizeResult) -> gate_pb2.AuthorizeEffectResponse:
    attempt = result.attempt
    return gate_pb2.AuthorizeEffectResponse(
        outcome=common_pb2.Outcome.Value(result.outcome.value),
        effect_id=result.effect_id,
        attempt_id=attempt.attempt_id if attempt else "",
        provider_idempotency_key=attempt.provider_key if attempt else "",
        lease_expires_at=timestamp(attempt.lease_expires_at) if attempt else None,
        intent_digest=result.intent_digest,
        reasons=[reason_to_proto(r) for r in result.reasons],
        decision_id=result.decision_id,
        policy_revision=result.policy_revision,
        receipt=receipt_to_proto(result.receipt),
        provider_key_reused=attempt.provider_key_reused if attempt else False,
        tool_revision=result.tool_revision,
        effect_stage=stage_value(result.effect_stage),
        attempt_number=attempt.number if attempt else 0,
        approval_request_id=result.approval_request_id,
        approval_id=attempt.approval_id if attempt else "",
        reservation_ids=list(result.reservation_ids),
        schedule_id=result.schedule_id,
    )


def attempt_to_proto(attempt: Attempt) -> gate_pb2.Attempt:
    return gate_pb2.Attempt(
        attempt_id=attempt.attempt_id,
        effect_id=attempt.effect_id,
        number=attempt.number,
        stage=stage_value(attempt.stage),
        provider_idempotency_key=attempt.provider_key,
        lease_expires_at=timestamp(attempt.lease_expires_at),
        authorized_at=timestamp(attempt.authorized_at),
        dispatched_at=timestamp(attempt.dispatched_at),
        finished_at=timestamp(attempt.finished_at),
        decision_id=attempt.decision_id,
        outcome_reason=attempt.outcome_reason,
        failure_evidence=evidence_value(attempt.failure_evidence),
        receipt=receipt_to_proto(attempt.receipt),
        provider_key_reused=attempt.provider_key_reused,
        approval_id=attempt.approval_id,
    )


def attempt_response(result: AttemptResult) -> gate_pb2.AttemptResponse:
    return gate_pb2.AttemptResponse(
        attempt=attempt_to_proto(result.attempt),
        effect_stage=stage_value(result.effect_stage),
        changed=result.changed,
    )


def effect_to_proto(effect: Effect) -> gate_pb2.Effect:
    return gate_pb2.Effect(
        effect_id=effect.effect_id,
        run_id=effect.run_id,
        tool=effect.tool,
        tool_revision=effect.tool_revision,
        target=effect.target,
        idempotency_key=effect.idempotency_key,
        intent_digest=effect.intent_digest,
        arguments_json=canonical.canonical_bytes(effect.arguments),
        stage=stage_value(effect.stage),
        attempts=[attempt_to_proto(a) for a in effect.attempts],
        receipt=receipt_to_proto(effect.receipt),
        created_at=timestamp(effect.created_at),
        updated_at=timestamp(effect.updated_at),
        reconciled_by=effect.reconciled_by,
        reconcile_reason=effect.reconcile_reason,
    )


def decision_to_proto(decision: Decision) -> gate_pb2.Decision:
    return gate_pb2.Decision(
        decision_id=decision.decision_id,
        run_id=decision.run_id,
        effect_id=decision.effect_id or "",
        attempt_id=decision.attempt_id or "",
        outcome=common_pb2.Outcome.Value(decision.outcome.value),
        reasons=[reason_to_proto(r) for r in decision.reasons],
        policy_revision=decision.policy_revision,
        engine=decision.engine,
        input_digest=decision.input_digest,
        input_json=decision.input_json,
        intent_digest=decision.intent_digest,
        idempotency_key=decision.idempotency_key,
        principal_id=decision.principal_id,
        created_at=timestamp(decision.created_at),
        tool=decision.tool,
    )


def replay_to_proto(found: Replay) -> gate_pb2.ReplayDecisionResponse:
    return gate_pb2.ReplayDecisionResponse(
        recorded=decision_to_proto(found.recorded),
        outcome=common_pb2.Outcome.Value(found.answer.outcome.value),
        reasons=[reason_to_proto(r) for r in found.answer.reasons],
        policy_revision=found.answer.revision,
        engine=found.answer.engine,
        package=found.package,
        outcome_changed=found.outcome_changed,
        policy_changed=found.policy_changed,
        reasons_added=found.reasons_added,
        reasons_removed=found.reasons_removed,
    )


# --- approvals and budgets -----------------------------------------------------------------

from effect_ledger.domain.approvals import Approval, ApprovalState  # noqa: E402
from effect_ledger.domain.budgets import Budget, Reservation, Scope  # noqa: E402
from effectledger.v1 import approvals_pb2, budgets_pb2  # noqa: E402


def approval_to_proto(approval: Approval, now: datetime) -> approvals_pb2.Approval:
    return approvals_pb2.Approval(
        approval_id=approval.approval_id,
        run_id=approval.run_id,
        tool=approval.tool,
        tool_revision=approval.tool_revision,
        target=approval.target,
        intent_digest=approval.intent_digest,
        arguments_json=canonical.canonical_bytes(approval.arguments),
        requested_by=approval.requested_by,
        state=approvals_pb2.ApprovalState.Value(approval.effective_state(now).value),
        reusable=approval.reusable,
        quorum=approval.quorum,
        reason=approval.reason,
        created_at=timestamp(approval.created_at),
        expires_at=timestamp(approval.expires_at),
        updated_at=timestamp(approval.updated_at),
        votes=[
            approvals_pb2.ApprovalVote(
                reviewer_id=vote.reviewer_id,
                approve=vote.approve,
                comment=vote.comment,
                created_at=timestamp(vote.created_at),
            )
            for vote in approval.votes
        ],
        consumed_by_attempt=approval.consumed_by_attempt,
        revoked_by=approval.revoked_by,
        revoke_reason=approval.revoke_reason,
    )


def approval_state_filter(value: int) -> str:
    state = enum_value(approvals_pb2.ApprovalState, value, "state", ApprovalState, required=False)
    return state.value if state is not None else ""


def scope_from_proto(value: int) -> Scope:
    return enum_value(budgets_pb2.BudgetScope, value, "scope", Scope)


def scope_filter(value: int) -> Scope | None:
    """A BudgetScope filter; BUDGET_SCOPE_UNSPECIFIED means every scope."""
    return enum_value(budgets_pb2.BudgetScope, value, "scope", Scope, required=False)


def budget_to_proto(budget: Budget) -> budgets_pb2.Budget:
    return budgets_pb2.Budget(
        budget_id=budget.budget_id,
        scope=budgets_pb2.BudgetScope.Value(budget.scope.value),
        scope_id=budget.scope_id,
        dimension=budget.dimension,
        limit=budget.limit,
        posted=budget.posted,
        pending=budget.pending,
        available=budget.available,
        reset_period_seconds=budget.reset_period_seconds or 0,
        period_started_at=timestamp(budget.period_started_at),
        created_at=timestamp(budget.created_at),
        updated_at=timestamp(budget.updated_at),
        exhausted=budget.exhausted,
    )


def reservation_to_proto(reservation: Reservation) -> budgets_pb2.Reservation:
    return budgets_pb2.Reservation(
        reservation_id=reservation.reservation_id,
        budget_id=reservation.budget_id,
        attempt_id=reservation.attempt_id,
        effect_id=reservation.effect_id,
        dimension=reservation.dimension,
        amount=reservation.amount,
        state=budgets_pb2.ReservationState.Value(f"RESERVATION_{reservation.state.value}"),
        posted_amount=reservation.posted_amount,
        created_at=timestamp(reservation.created_at),
        settled_at=timestamp(reservation.settled_at),
    )


# The instants a request may name: RFC 3339's years 0001 to 9999, whole nanoseconds.
TIMESTAMP_SECONDS_MIN = -62_135_596_800
TIMESTAMP_SECONDS_MAX = 253_402_300_799


def time_from_proto(stamp: Timestamp, field: str) -> datetime:
    """A request's timestamp as an aware UTC datetime; out of range: INVALID_ARGUMENT."""
    if not (TIMESTAMP_SECONDS_MIN <= stamp.seconds <= TIMESTAMP_SECONDS_MAX and 0 <= stamp.nanos < 1_000_000_000):
        raise InvalidArgument.field(field, "is not a valid timestamp (years 1 to 9999)", reason="INVALID_TIMESTAMP")
    return stamp.ToDatetime(tzinfo=UTC)


def optional_time(message: Any, field: str) -> datetime | None:
    """A request's optional timestamp field (None when unset)."""
    return time_from_proto(getattr(message, field), field) if message.HasField(field) else None


def stages_filter(values: Any) -> frozenset[Stage]:
    """A repeated Stage filter; empty means every stage."""
    if len(values) > len(Stage):
        raise InvalidArgument.field("stages", f"at most {len(Stage)} stages", reason="TOO_MANY_VALUES")
    return frozenset(
        enum_value(common_pb2.Stage, value, f"stages[{index}]", Stage) for index, value in enumerate(values)
    )


def outcome_filter(value: int) -> Outcome | None:
    """An Outcome filter; OUTCOME_UNSPECIFIED means any outcome."""
    return enum_value(common_pb2.Outcome, value, "outcome", Outcome, required=False)


# --- scheduled intents ----------------------------------------------------------------------

from effect_ledger.domain.schedules import CancelCondition, Purpose, Schedule, ScheduleState  # noqa: E402
from effectledger.v1 import schedules_pb2  # noqa: E402

# The proto's names are the domain's, prefixed where the package already uses the bare name.
SCHEDULE_STATES = {
    number: ScheduleState(name.removeprefix("SCHEDULE_"))
    for name, number in schedules_pb2.ScheduleState.items()
    if number
}
SCHEDULE_STATE_NUMBERS = {state: number for number, state in SCHEDULE_STATES.items()}
CANCEL_CONDITIONS = {
    number: CancelCondition(name.removeprefix("CANCEL_WHEN_"))
    for name, number in schedules_pb2.CancelCondition.items()
    if number
}
CANCEL_CONDITION_NUMBERS = {condition: number for number, condition in CANCEL_CONDITIONS.items()}
# Earliest and latest instants a request's timestamp may name (RFC 3339's range, as protobuf's).
TIMESTAMP_SECONDS_MIN = -62_135_596_800
TIMESTAMP_SECONDS_MAX = 253_402_300_799


def schedule_to_proto(schedule: Schedule) -> schedules_pb2.Schedule:
    return schedules_pb2.Schedule(
        schedule_id=schedule.schedule_id,
        run_id=schedule.run_id,
        idempotency_key=schedule.idempotency_key,
        tool=schedule.tool,
        tool_revision=schedule.tool_revision,
        target=schedule.target,
        arguments_json=canonical.canonical_bytes(schedule.arguments),
        intent_digest=schedule.intent_digest,
        effect_id=schedule.effect_id or "",
        purpose=schedules_pb2.SchedulePurpose.Value(schedule.purpose.value),
        state=SCHEDULE_STATE_NUMBERS[schedule.state],
        not_before=timestamp(schedule.not_before),
        deadline=timestamp(schedule.deadline),
        cancel_conditions=[CANCEL_CONDITION_NUMBERS[c] for c in schedule.cancel_conditions],
        reservation=schedule.reservation,
        clock="database",
        note=schedule.note,
        created_by=schedule.created_by,
        created_at=timestamp(schedule.created_at),
        due_at=timestamp(schedule.due_at),
        due_sequence=schedule.due_sequence or 0,
        fired_by=schedule.fired_by or "",
        closed_at=timestamp(schedule.closed_at),
        closed_by=schedule.closed_by,
        close_reason=schedule.close_reason,
        decision_id=schedule.decision_id or "",
    )


def request_time(message: Any, field: str) -> datetime | None:
    """A request's optional Timestamp as an aware datetime (None when unset); out of range or
    with invalid nanos is INVALID_ARGUMENT."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    if not TIMESTAMP_SECONDS_MIN <= value.seconds <= TIMESTAMP_SECONDS_MAX or not 0 <= value.nanos < 1_000_000_000:
        raise InvalidArgument.field(field, "is not a valid timestamp", reason="INVALID_TIMESTAMP")
    return value.ToDatetime(tzinfo=UTC)


def schedule_purpose(value: int) -> Purpose:
    return enum_value(schedules_pb2.SchedulePurpose, value, "purpose", Purpose)


def cancel_conditions(values: Any) -> tuple[CancelCondition, ...]:
    found = []
    for index, value in enumerate(values):
        enum_value(schedules_pb2.CancelCondition, value, f"cancel_conditions[{index}]")  # checked: defined, not 0
        found.append(CANCEL_CONDITIONS[value])
    return tuple(found)


def schedule_state_filter(value: int) -> str:
    if enum_value(schedules_pb2.ScheduleState, value, "state", required=False) is None:
        return ""
    return SCHEDULE_STATES[value].value
