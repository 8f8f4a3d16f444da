"""Scheduled intents: recorded by an agent, fired by the scheduler of any replica, reconsidered
by the gate (see ``domain/schedules.py`` for the rules and docs/schedules.md for why).

Lock order is the ledger's: the effect bound to the key, then the schedule, then budget rows,
then the run row (trace events are appended last, at the end of the unit of work).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from effect_ledger.config import Limits
from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain.canonical import intent_digest, parse_json
from effect_ledger.domain.contracts import check_identifier, check_target, check_text, check_tool_name
from effect_ledger.domain.model import Principal, Role, Stage
from effect_ledger.domain.schedules import (
    FIRE_BATCH_MAX,
    SECTION_SCHEDULES_MAX,
    CancelCondition,
    Purpose,
    Schedule,
    ScheduleState,
    eligibility,
    expired,
    resume_cancels,
)
from effect_ledger.domain.trace import timestamp_text
from effect_ledger.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from effect_ledger.service import budgets
from effect_ledger.service.leases import adopt_clock
from effect_ledger.storage import budget_store, schedule_store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import Database, UnitOfWork

log = logging.getLogger(__name__)

# Who may cancel a schedule besides the agent that made it.
CANCELLING_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})
SCHEDULER = "scheduler"
# ``fired_by`` of a schedule the gate fired itself (its time had come before a scheduler pass).
GATE = "gate"


@dataclass(frozen=True)
class ScheduleCommand:
    run_id: str
    tool: str
    arguments_json: bytes
    idempotency_key: str
    target: str
    purpose: Purpose
    not_before: datetime | None
    delay_seconds: int
    deadline: datetime | None
    cancel_conditions: tuple[CancelCondition, ...] = ()
    hold_budget: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _event_payload(schedule: Schedule, **extra: Any) -> dict[str, Any]:
    payload = {
        "schedule_id": schedule.schedule_id,
        "idempotency_key": schedule.idempotency_key,
        "tool": schedule.tool,
        "intent_digest": schedule.intent_digest,
    }
    payload.update(extra)
    return payload


async def schedule_intent(unit: UnitOfWork, principal: Principal, command: ScheduleCommand, limits: Limits) -> Schedule:
    """Record an intention to reconsider the key's effect from ``not_before`` (one open schedule
    per key; the same intent asked again returns the open one)."""
    check_identifier(command.run_id, "run_id")
    check_tool_name(command.tool)
    check_identifier(command.idempotency_key, "idempotency_key")
    check_target(command.target)
    arguments = parse_json(
        command.arguments_json, field="arguments_json", size_max_bytes=limits.arguments_size_max_bytes
    )
    check_text(command.note, "note", required=False, length_max=1024, lines=True)
    tenant = principal.tenant_id
    connection = unit.connection
    run = await repo.get_run(connection, tenant, command.run_id)
    if run is None:
        raise NotFound("run", command.run_id)
    effect = adopt_clock(unit, await repo.lock_effect_by_key(connection, tenant, command.idempotency_key))
    current = await repo.latest_contract(connection, tenant, command.tool)
    if current is None:
        raise FailedPrecondition(
            f"no contract is registered for tool {command.tool!r}",
            reason="TOOL_UNKNOWN",
            metadata={"tool": command.tool},
        )
    if current.retired:
        raise FailedPrecondition(
            f"tool {command.tool!r} is retired", reason="TOOL_RETIRED", metadata={"tool": command.tool}
        )
    revision = effect.tool_revision if effect is not None else current.revision
    digest = intent_digest(tool=command.tool, tool_revision=revision, target=command.target, arguments=arguments)
    if effect is not None:
        if effect.run_id != run.run_id or effect.intent_digest != digest:
            raise FailedPrecondition(
                "the idempotency key names another intent",
                reason="IDEMPOTENCY_KEY_REUSED",
                metadata={"effect_id": effect.effect_id},
            )
        if effect.stage == Stage.SUCCEEDED:
            raise FailedPrecondition(
                f"effect {effect.effect_id} already SUCCEEDED: there is nothing to reconsider",
                reason="EFFECT_ALREADY_SUCCEEDED",
                metadata={"effect_id": effect.effect_id},
            )
    existing = await schedule_store.open_for_key(connection, tenant, command.idempotency_key)
    if existing is not None:
        if existing.intent_digest == digest and existing.run_id == run.run_id:
            return existing  # asked again (a retry after a lost answer): the same schedule
        raise FailedPrecondition(
            f"schedule {existing.schedule_id} is open for this key",
            reason="SCHEDULE_EXISTS",
            metadata={"schedule_id": existing.schedule_id},
        )
    not_before, deadline = eligibility(unit.now, command.not_before, command.delay_seconds, command.deadline)
    schedule_id = repo.new_id("sch")
    effect_id = effect.effect_id if effect is not None else None
    held: dict[str, int] = {}
    if command.hold_budget:
        held = await _hold(unit, tenant, run, current.default_estimate, schedule_id, effect_id or "")
    schedule = Schedule(
        schedule_id=schedule_id,
        run_id=run.run_id,
        idempotency_key=command.idempotency_key,
        tool=command.tool,
        tool_revision=revision,
        target=command.target,
        arguments=arguments,
        intent_digest=digest,
        effect_id=effect_id,
        purpose=command.purpose,
        not_before=not_before,
        deadline=deadline,
        cancel_conditions=tuple(dict.fromkeys(command.cancel_conditions)),
        reservation=held,
        state=ScheduleState.SCHEDULED,
        note=command.note,
        created_by=principal.principal_id,
        created_at=unit.now,
    )
    await schedule_store.insert_schedule(connection, tenant, schedule)
    unit.record_event(
        tenant,
        run.run_id,
        "schedule.created",
        _event_payload(
            schedule,
            purpose=schedule.purpose.value,
            not_before=timestamp_text(not_before),
            deadline=timestamp_text(deadline) if deadline else None,
            cancel_conditions=[c.value for c in schedule.cancel_conditions],
            reservation=held,
        ),
        principal.principal_id,
    )
    return schedule


async def _hold(
    unit: UnitOfWork, tenant: str, run: Any, default_estimate: dict[str, int], holder_id: str, effect_id: str
) -> dict[str, int]:
    """Reserve the tool contract's default estimate for the schedule (never a caller's amount)."""
    estimate = budget_rules.validate_amounts(
        dict(default_estimate), "estimate", await budgets.dimensions_for(unit, tenant, dict(default_estimate))
    )
    applicable = await budget_store.applicable_budgets(unit.connection, tenant, run.run_id, run.root_run_id, unit.now)
    _ids, exhausted = await budgets.reserve(unit, tenant, applicable, estimate, holder_id, effect_id)
    if exhausted is not None:
        raise FailedPrecondition(
            f"dimension {exhausted}: the tool's default estimate does not fit in the budget",
            reason="BUDGET_EXHAUSTED",
            metadata={"dimension": exhausted},
        )
    return {dimension: amount for dimension, amount in estimate.items() if amount}


async def close(
    unit: UnitOfWork,
    tenant: str,
    schedule: Schedule,
    state: ScheduleState,
    closed_by: str,
    reason: str,
    decision_id: str | None = None,
) -> bool:
    """Close an open schedule once and release what it holds; False when it was closed already."""
    if not await schedule_store.close(
        unit.connection, tenant, schedule.schedule_id, state, unit.now, closed_by, reason, decision_id
    ):
        return False
    await budgets.release_holder(unit, tenant, schedule.schedule_id)
    event = {
        ScheduleState.CONSUMED: "schedule.consumed",
        ScheduleState.CANCELLED: "schedule.cancelled",
        ScheduleState.EXPIRED: "schedule.expired",
    }[state]
    unit.record_event(
        tenant,
        schedule.run_id,
        event,
        _event_payload(schedule, reason=reason, decision_id=decision_id),
        closed_by,
    )
    return True


async def fire(unit: UnitOfWork, tenant: str, schedule: Schedule, fired_by: str) -> bool:
    """SCHEDULED -> DUE (once, by the database clock), with its trace event."""
    sequence = await schedule_store.fire(unit.connection, tenant, schedule.schedule_id, unit.now, fired_by)
    if sequence is None:
        return False
    unit.record_event(
        tenant,
        schedule.run_id,
        "schedule.due",
        _event_payload(
            schedule, due_sequence=sequence, fired_by=fired_by, not_before=timestamp_text(schedule.not_before)
        ),
        SCHEDULER,
    )
    return True


async def cancel(unit: UnitOfWork, principal: Principal, schedule_id: str, reason: str) -> Schedule:
    check_identifier(schedule_id, "schedule_id")
    check_text(reason, "reason", required=True, lines=True)
    tenant = principal.tenant_id
    schedule = await schedule_store.get(unit.connection, tenant, schedule_id, lock=True)
    if schedule is None:
        raise NotFound("schedule", schedule_id)
    if schedule.created_by != principal.principal_id and not principal.has_any(CANCELLING_ROLES):
        raise PermissionDenied(
            "only the agent that made a schedule, an operator or an admin may cancel it",
            reason="SCHEDULE_NOT_OWNED",
            metadata={"schedule_id": schedule_id},
        )
    if not schedule.state.open:
        raise FailedPrecondition(
            f"schedule {schedule_id} is {schedule.state.value}",
            reason="SCHEDULE_CLOSED",
            metadata={"schedule_id": schedule_id, "state": schedule.state.value},
        )
    await close(unit, tenant, schedule, ScheduleState.CANCELLED, principal.principal_id, reason)
    return await _reread(unit, tenant, schedule_id)


async def _reread(unit: UnitOfWork, tenant: str, schedule_id: str) -> Schedule:
    found = await schedule_store.get(unit.connection, tenant, schedule_id)
    assert found is not None, "a schedule just written is there"
    return found


async def get(unit: UnitOfWork, principal: Principal, schedule_id: str) -> Schedule:
    check_identifier(schedule_id, "schedule_id")
    found = await schedule_store.get(unit.connection, principal.tenant_id, schedule_id)
    if found is None:
        raise NotFound("schedule", schedule_id)
    return found


async def list_schedules(
    unit: UnitOfWork, principal: Principal, *, run_id: str, state: str, before_id: str, limit: int
) -> list[Schedule]:
    _check_run_filter(run_id)
    return await schedule_store.page(
        unit.connection, principal.tenant_id, run_id=run_id, state=state, before_id=before_id, limit=limit
    )


async def due_after(
    unit: UnitOfWork, principal: Principal, after_sequence: int, run_id: str, limit: int
) -> list[Schedule]:
    if after_sequence < 0:
        raise InvalidArgument.field("after_sequence", "must not be negative")
    _check_run_filter(run_id)
    return await schedule_store.due_after(unit.connection, principal.tenant_id, after_sequence, run_id, limit)


def _check_run_filter(run_id: str) -> None:
    """An optional run filter (empty: every run of the tenant) is a well-formed id when given."""
    if run_id:
        check_identifier(run_id, "run_id")


# --- the gate's part ------------------------------------------------------------------------


async def for_gate(unit: UnitOfWork, tenant: str, key: str) -> Schedule | None:
    """The key's open schedule as the gate must judge it: a lapsed one is expired (and releases
    what it held) and no longer counts; one past ``not_before`` that no scheduler fired yet is
    fired now (the same conditional move); what is left is open, due or not."""
    schedule = await schedule_store.open_for_key(unit.connection, tenant, key)
    if schedule is None:
        return None
    if expired(schedule, unit.now):
        await close(unit, tenant, schedule, ScheduleState.EXPIRED, SCHEDULER, "the deadline passed")
        return None
    if schedule.state == ScheduleState.SCHEDULED and schedule.not_before <= unit.now:
        await fire(unit, tenant, schedule, GATE)
        return await _reread(unit, tenant, schedule.schedule_id)
    return schedule


# --- the scheduler --------------------------------------------------------------------------


async def tick(database: Database, replica: str, batch_max: int = FIRE_BATCH_MAX) -> dict[str, int]:
    """One pass of a replica's scheduler: fire what is due, expire what lapsed, cancel what a
    condition cancels. One transaction per schedule; returns how many it moved, by new state."""
    ripe = await database.run(lambda unit: schedule_store.ripe(unit.connection, unit.now, batch_max))
    moved: dict[str, int] = {}
    for tenant, schedule_id in ripe:
        state = await database.run(functools.partial(_advance, tenant=tenant, schedule_id=schedule_id, replica=replica))
        if state is not None:
            moved[state.value] = moved.get(state.value, 0) + 1
    return moved


async def _advance(unit: UnitOfWork, *, tenant: str, schedule_id: str, replica: str) -> ScheduleState | None:
    """Move one schedule as its time and conditions say; the state it moved to, or None when
    it was not this pass's to move (another replica or the gate moved it, or it is not ripe)."""
    schedule = await schedule_store.get(unit.connection, tenant, schedule_id, lock=True)
    if schedule is None or not schedule.state.open:
        return None
    if expired(schedule, unit.now):
        closed = await close(unit, tenant, schedule, ScheduleState.EXPIRED, SCHEDULER, "the deadline passed")
        return ScheduleState.EXPIRED if closed else None
    if schedule.state != ScheduleState.SCHEDULED:
        return None
    if CancelCondition.EFFECT_SUCCEEDED in schedule.cancel_conditions:
        effect = await repo.effect_by_key(unit.connection, tenant, schedule.idempotency_key)
        if effect is not None and effect.stage == Stage.SUCCEEDED:
            reason = f"effect {effect.effect_id} SUCCEEDED before the schedule was due"
            closed = await close(unit, tenant, schedule, ScheduleState.CANCELLED, SCHEDULER, reason)
            return ScheduleState.CANCELLED if closed else None
    return ScheduleState.DUE if await fire(unit, tenant, schedule, replica) else None


async def resume_cancellations(unit: UnitOfWork, tenant: str, run_id: str, listed: set[str], by: str) -> list[str]:
    """At a resume: cancel the run's open schedules that ask for it and that the resumed
    checkpoint does not list (they belong to a timeline the resume left)."""
    cancelled = []
    for schedule in await schedule_store.open_of_run(unit.connection, tenant, run_id, SECTION_SCHEDULES_MAX):
        if resume_cancels(schedule, listed):
            await close(
                unit, tenant, schedule, ScheduleState.CANCELLED, by, "the run was resumed from a checkpoint without it"
            )
            cancelled.append(schedule.schedule_id)
    return cancelled


# --- resume ---------------------------------------------------------------------------------


def _time_of(text: Any) -> datetime | None:
    if text is None:
        return None
    return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


async def carry_over(
    unit: UnitOfWork, principal: Principal, run_id: str, listed: list[dict[str, Any]]
) -> dict[str, list[str]]:
    """At a resume from a checkpoint that lists ``listed`` open schedules: cancel the run's open
    ones that ask for it and are not listed; rebuild the listed ones this deployment has no
    record of (an imported run), from the checkpoint's durable record, with the hold the tool's
    contract asks for now (never an amount from the archive). Returns what it did, by id."""
    tenant = principal.tenant_id
    listed = [item for item in listed if isinstance(item, dict) and isinstance(item.get("schedule_id"), str)]
    cancelled = await resume_cancellations(
        unit, tenant, run_id, {item["schedule_id"] for item in listed}, principal.principal_id
    )
    rebuilt, skipped = [], []
    for item in listed:
        if await schedule_store.get(unit.connection, tenant, item["schedule_id"]) is not None:
            continue  # this deployment's own record stands (open, or closed since the checkpoint)
        try:
            schedule = await _rebuilt(unit, principal, run_id, item)
        except (KeyError, TypeError, ValueError) as error:
            skipped.append(f"{item['schedule_id']}: {error}")
            continue
        if schedule is None:
            skipped.append(item["schedule_id"])
            continue
        rebuilt.append(schedule.schedule_id)
    return {"cancelled": cancelled, "rebuilt": rebuilt, "not_rebuilt": skipped}


async def _rebuilt(unit: UnitOfWork, principal: Principal, run_id: str, item: dict[str, Any]) -> Schedule | None:
    tenant = principal.tenant_id
    deadline = _time_of(item["deadline"])
    if deadline is not None and deadline <= unit.now:
        return None  # lapsed meanwhile: nothing to reconsider
    if await schedule_store.open_for_key(unit.connection, tenant, str(item["idempotency_key"])) is not None:
        return None
    contract = await repo.latest_contract(unit.connection, tenant, str(item["tool"]))
    if contract is None or contract.retired:
        return None
    run = await repo.get_run(unit.connection, tenant, run_id)
    assert run is not None, "a resumed run exists"
    held: dict[str, int] = {}
    if item.get("reservation"):
        try:
            held = await _hold(unit, tenant, run, contract.default_estimate, str(item["schedule_id"]), "")
        except FailedPrecondition:
            held = {}  # the budget has no room now: rebuilt without a hold (the event says so)
    schedule = Schedule(
        schedule_id=str(item["schedule_id"]),
        run_id=run_id,
        idempotency_key=str(item["idempotency_key"]),
        tool=str(item["tool"]),
        tool_revision=int(item["tool_revision"]),
        target=str(item["target"]),
        arguments=dict(item["arguments"]),
        intent_digest=str(item["intent_digest"]),
        effect_id=None,
        purpose=Purpose(item["purpose"]),
        not_before=_time_of(item["next_eligibility"]) or unit.now,
        deadline=deadline,
        cancel_conditions=tuple(CancelCondition(c) for c in item["cancel_conditions"]),
        reservation=held,
        state=ScheduleState.SCHEDULED,
        note=str(item.get("note", "")),
        created_by=principal.principal_id,
        created_at=unit.now,
    )
    await schedule_store.insert_schedule(unit.connection, tenant, schedule)
    unit.record_event(
        tenant,
        run_id,
        "schedule.created",
        _event_payload(
            schedule,
            purpose=schedule.purpose.value,
            not_before=timestamp_text(schedule.not_before),
            deadline=timestamp_text(deadline) if deadline else None,
            cancel_conditions=[c.value for c in schedule.cancel_conditions],
            reservation=held,
            rebuilt_from_checkpoint=True,
            reservation_in_checkpoint=item.get("reservation") or {},
        ),
        principal.principal_id,
    )
    return schedule
