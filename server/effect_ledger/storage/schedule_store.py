"""Scheduled intents' rows. Every state change is one conditional UPDATE from an open state,
so of any number of replicas (or a replica and the gate) exactly one moves a schedule on."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.schedules import OPEN_STATES, CancelCondition, Purpose, Schedule, ScheduleState
from effect_ledger.storage.approval_store import next_sequence
from effect_ledger.storage.dialect import is_postgresql
from effect_ledger.storage.schema import schedules

DUE_SEQUENCE = "schedule_due"


def _text(value: Any) -> str:
    return canonical_bytes(value).decode()


def _schedule(row: Row[Any]) -> Schedule:
    return Schedule(
        schedule_id=row.schedule_id,
        run_id=row.run_id,
        idempotency_key=row.idempotency_key,
        tool=row.tool,
        tool_revision=row.tool_revision,
        target=row.target,
        arguments=json.loads(row.arguments),
        intent_digest=row.intent_digest,
        effect_id=row.effect_id,
        purpose=Purpose(row.purpose),
        not_before=row.not_before,
        deadline=row.deadline,
        cancel_conditions=tuple(CancelCondition(c) for c in json.loads(row.cancel_conditions)),
        reservation={k: int(v) for k, v in json.loads(row.reservation).items()},
        state=ScheduleState(row.state),
        note=row.note,
        created_by=row.created_by,
        created_at=row.created_at,
        due_at=row.due_at,
        due_sequence=row.due_sequence,
        fired_by=row.fired_by,
        closed_at=row.closed_at,
        closed_by=row.closed_by,
        close_reason=row.close_reason,
        decision_id=row.decision_id,
    )


async def insert_schedule(connection: AsyncConnection, tenant_id: str, schedule: Schedule) -> None:
    await connection.execute(
        insert(schedules).values(
            tenant_id=tenant_id,
            schedule_id=schedule.schedule_id,
            run_id=schedule.run_id,
            idempotency_key=schedule.idempotency_key,
            tool=schedule.tool,
            tool_revision=schedule.tool_revision,
            target=schedule.target,
            arguments=_text(schedule.arguments),
            intent_digest=schedule.intent_digest,
            effect_id=schedule.effect_id,
            purpose=schedule.purpose.value,
            not_before=schedule.not_before,
            deadline=schedule.deadline,
            cancel_conditions=_text([c.value for c in schedule.cancel_conditions]),
            reservation=_text(schedule.reservation),
            state=schedule.state.value,
            note=schedule.note,
            created_by=schedule.created_by,
            created_at=schedule.created_at,
            closed_by="",
            close_reason="",
        )
    )


async def get(connection: AsyncConnection, tenant_id: str, schedule_id: str, *, lock: bool = False) -> Schedule | None:
    query = select(schedules).where(schedules.c.tenant_id == tenant_id, schedules.c.schedule_id == schedule_id)
    if lock and is_postgresql(connection):
        query = query.with_for_update()
    row = (await connection.execute(query)).one_or_none()
    return _schedule(row) if row is not None else None


async def open_for_key(connection: AsyncConnection, tenant_id: str, key: str) -> Schedule | None:
    """The key's open schedule (at most one: a partial unique index), locked."""
    query = select(schedules).where(
        schedules.c.tenant_id == tenant_id,
        schedules.c.idempotency_key == key,
        schedules.c.state.in_(OPEN_STATES),
    )
    if is_postgresql(connection):
        query = query.with_for_update()
    row = (await connection.execute(query)).one_or_none()
    return _schedule(row) if row is not None else None


async def open_of_run(connection: AsyncConnection, tenant_id: str, run_id: str, limit: int) -> list[Schedule]:
    query = (
        select(schedules)
        .where(schedules.c.tenant_id == tenant_id, schedules.c.run_id == run_id, schedules.c.state.in_(OPEN_STATES))
        .order_by(schedules.c.schedule_id)
        .limit(limit)
    )
    if is_postgresql(connection):
        query = query.with_for_update()
    return [_schedule(row) for row in (await connection.execute(query)).all()]


async def page(
    connection: AsyncConnection, tenant_id: str, *, run_id: str, state: str, before_id: str, limit: int
) -> list[Schedule]:
    """Newest first (schedule ids are time-ordered)."""
    conditions = [schedules.c.tenant_id == tenant_id]
    if run_id:
        conditions.append(schedules.c.run_id == run_id)
    if state:
        conditions.append(schedules.c.state == state)
    if before_id:
        conditions.append(schedules.c.schedule_id < before_id)
    rows = (
        await connection.execute(
            select(schedules).where(*conditions).order_by(schedules.c.schedule_id.desc()).limit(limit)
        )
    ).all()
    return [_schedule(row) for row in rows]


async def due_after(
    connection: AsyncConnection, tenant_id: str, after_sequence: int, run_id: str, limit: int
) -> list[Schedule]:
    conditions = [schedules.c.tenant_id == tenant_id, schedules.c.due_sequence > after_sequence]
    if run_id:
        conditions.append(schedules.c.run_id == run_id)
    rows = (
        await connection.execute(select(schedules).where(*conditions).order_by(schedules.c.due_sequence).limit(limit))
    ).all()
    return [_schedule(row) for row in rows]


async def ripe(connection: AsyncConnection, now: datetime, limit: int) -> list[tuple[str, str]]:
    """(tenant, schedule id) of schedules every tenant has waiting past ``not_before`` or past
    their deadline, oldest first; read without locks (each is then moved conditionally)."""
    due = (
        select(schedules.c.tenant_id, schedules.c.schedule_id, schedules.c.not_before)
        .where(schedules.c.state == ScheduleState.SCHEDULED.value, schedules.c.not_before <= now)
        .order_by(schedules.c.not_before)
        .limit(limit)
    )
    lapsed = (
        select(schedules.c.tenant_id, schedules.c.schedule_id, schedules.c.not_before)
        .where(
            schedules.c.state.in_(OPEN_STATES),
            schedules.c.deadline.is_not(None),
            schedules.c.deadline <= now,
        )
        .order_by(schedules.c.not_before)
        .limit(limit)
    )
    found = [(row.tenant_id, row.schedule_id) for row in (await connection.execute(due)).all()]
    found += [(row.tenant_id, row.schedule_id) for row in (await connection.execute(lapsed)).all()]
    return list(dict.fromkeys(found))


async def fire(
    connection: AsyncConnection, tenant_id: str, schedule_id: str, now: datetime, fired_by: str
) -> int | None:
    """SCHEDULED -> DUE when ``not_before`` has passed, once; returns its due sequence, or None
    when another replica (or the gate) moved it first."""
    moved = (
        await connection.execute(
            update(schedules)
            .where(
                schedules.c.tenant_id == tenant_id,
                schedules.c.schedule_id == schedule_id,
                schedules.c.state == ScheduleState.SCHEDULED.value,
                schedules.c.not_before <= now,
            )
            .values(state=ScheduleState.DUE.value, due_at=now, fired_by=fired_by)
        )
    ).rowcount
    if moved != 1:
        return None
    sequence = await next_sequence(connection, tenant_id, DUE_SEQUENCE)
    await connection.execute(
        update(schedules)
        .where(schedules.c.tenant_id == tenant_id, schedules.c.schedule_id == schedule_id)
        .values(due_sequence=sequence)
    )
    return sequence


async def close(
    connection: AsyncConnection,
    tenant_id: str,
    schedule_id: str,
    state: ScheduleState,
    now: datetime,
    closed_by: str,
    reason: str,
    decision_id: str | None = None,
) -> bool:
    """An open schedule -> CONSUMED, CANCELLED or EXPIRED, once."""
    assert not state.open, "close moves to a final state"
    moved = (
        await connection.execute(
            update(schedules)
            .where(
                schedules.c.tenant_id == tenant_id,
                schedules.c.schedule_id == schedule_id,
                schedules.c.state.in_(OPEN_STATES),
            )
            .values(state=state.value, closed_at=now, closed_by=closed_by, close_reason=reason, decision_id=decision_id)
        )
    ).rowcount
    return moved == 1
