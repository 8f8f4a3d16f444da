"""Scheduled intents: an intention to reconsider an effect later, never deferred permission.

A schedule names an intended effect (run, tool, target, arguments, idempotency key), the time
before which the gate refuses the key (``not_before``), an optional deadline, the conditions
that cancel it, and the budget it holds. States:

    SCHEDULED -> DUE -> CONSUMED          (the scheduler fires it; an AuthorizeEffect reconsiders it)
    SCHEDULED | DUE -> CANCELLED | EXPIRED (CancelSchedule or a condition; the deadline passed)

Every time is judged by the database server's clock (the governing clock), never a client's.
Closing a schedule releases what it holds. The service and the storage apply these rules; this
module holds them as plain values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from effect_ledger.domain.model import Reason
from effect_ledger.domain.trace import timestamp_text
from effect_ledger.errors import InvalidArgument

GOVERNING_CLOCK = "database"
# The farthest ahead a schedule may be (a year and a month): longer waits are re-scheduled.
HORIZON_MAX = timedelta(days=400)
NOTE_LENGTH_MAX = 1024
# Schedules the scheduler fires or expires per transaction, and the most one sealed checkpoint lists.
FIRE_BATCH_MAX = 100
SECTION_SCHEDULES_MAX = 1000


class ScheduleState(enum.StrEnum):
    SCHEDULED = "SCHEDULED"
    DUE = "DUE"
    CONSUMED = "CONSUMED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"

    @property
    def open(self) -> bool:
        return self in (ScheduleState.SCHEDULED, ScheduleState.DUE)


OPEN_STATES = (ScheduleState.SCHEDULED.value, ScheduleState.DUE.value)


class Purpose(enum.StrEnum):
    DELAYED_RETRY = "DELAYED_RETRY"
    RATE_LIMIT = "RATE_LIMIT"
    APPROVAL_WAIT = "APPROVAL_WAIT"
    RECOVERY_CHECK = "RECOVERY_CHECK"


class CancelCondition(enum.StrEnum):
    EFFECT_SUCCEEDED = "EFFECT_SUCCEEDED"
    RUN_RESUMED = "RUN_RESUMED"


@dataclass(frozen=True)
class Schedule:
    schedule_id: str
    run_id: str
    idempotency_key: str
    tool: str
    tool_revision: int
    target: str
    arguments: dict[str, Any]
    intent_digest: str
    effect_id: str | None
    purpose: Purpose
    not_before: datetime
    deadline: datetime | None
    cancel_conditions: tuple[CancelCondition, ...]
    reservation: dict[str, int]
    state: ScheduleState
    note: str
    created_by: str
    created_at: datetime
    due_at: datetime | None = None
    due_sequence: int | None = None
    fired_by: str | None = None
    closed_at: datetime | None = None
    closed_by: str = ""
    close_reason: str = ""
    decision_id: str | None = None

    def as_section(self) -> dict[str, Any]:
        """What a sealed checkpoint lists of an open schedule (its ``schedules`` section)."""
        return {
            "schedule_id": self.schedule_id,
            "idempotency_key": self.idempotency_key,
            "tool": self.tool,
            "tool_revision": self.tool_revision,
            "target": self.target,
            "arguments": self.arguments,
            "intent_digest": self.intent_digest,
            "effect_id": self.effect_id,
            "purpose": self.purpose.value,
            "state": self.state.value,
            "next_eligibility": timestamp_text(self.not_before),
            "deadline": timestamp_text(self.deadline) if self.deadline else None,
            "governing_clock": GOVERNING_CLOCK,
            "cancel_conditions": [c.value for c in self.cancel_conditions],
            "reservation": dict(sorted(self.reservation.items())),
            "note": self.note,
        }


def eligibility(
    now: datetime, not_before: datetime | None, delay_seconds: int, deadline: datetime | None
) -> tuple[datetime, datetime | None]:
    """``(not_before, deadline)`` from a request, judged against the database clock ``now``."""
    if (not_before is None) == (delay_seconds == 0):
        raise InvalidArgument.field(
            "not_before", "give either not_before or delay_seconds (one of the two)", reason="SCHEDULE_TIME_REQUIRED"
        )
    if delay_seconds < 0:
        raise InvalidArgument.field("delay_seconds", "must not be negative", reason="SCHEDULE_TIME_INVALID")
    if delay_seconds > HORIZON_MAX.total_seconds():
        raise InvalidArgument.field(
            "delay_seconds", f"must be at most {int(HORIZON_MAX.total_seconds())}", reason="SCHEDULE_TIME_INVALID"
        )
    eligible = not_before if not_before is not None else now + timedelta(seconds=delay_seconds)
    if eligible - now > HORIZON_MAX:
        raise InvalidArgument.field(
            "not_before", f"is more than {HORIZON_MAX.days} days ahead", reason="SCHEDULE_TIME_INVALID"
        )
    if deadline is not None:
        if deadline <= eligible:
            raise InvalidArgument.field("deadline", "must be after not_before", reason="SCHEDULE_TIME_INVALID")
        if deadline <= now:
            raise InvalidArgument.field("deadline", "has passed", reason="SCHEDULE_TIME_INVALID")
    return eligible, deadline


def gate_refusal(schedule: Schedule | None, now: datetime) -> Reason | None:
    """The gate's answer to a key with an open schedule: refused until due (by the database
    clock); a due one (fired or not yet) is reconsidered under the policy current now."""
    if schedule is None or not schedule.state.open:
        return None
    if schedule.state == ScheduleState.SCHEDULED and now < schedule.not_before:
        return Reason(
            "SCHEDULE_NOT_DUE",
            f"schedule {schedule.schedule_id} reconsiders this key at {timestamp_text(schedule.not_before)}",
        )
    return None


def expired(schedule: Schedule, now: datetime) -> bool:
    return schedule.state.open and schedule.deadline is not None and now >= schedule.deadline


def resume_cancels(schedule: Schedule, listed: set[str]) -> bool:
    """Whether a resume from a checkpoint listing ``listed`` schedules cancels this open one."""
    return (
        schedule.state.open
        and CancelCondition.RUN_RESUMED in schedule.cancel_conditions
        and schedule.schedule_id not in listed
    )
