"""The rules of scheduled intents, as plain values: eligibility from a request, the gate's
answer to a key with an open schedule, expiry, and what a resume cancels."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from effect_ledger.domain.schedules import (
    HORIZON_MAX,
    CancelCondition,
    Purpose,
    Schedule,
    ScheduleState,
    eligibility,
    expired,
    gate_refusal,
    resume_cancels,
)
from effect_ledger.errors import InvalidArgument

NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)


def schedule(**overrides) -> Schedule:
    values = dict(
        schedule_id="sch_1",
        run_id="run_1",
        idempotency_key="k",
        tool="email.send",
        tool_revision=1,
        target="mailto:bob@example.com",
        arguments={"to": "bob"},
        intent_digest="0" * 64,
        effect_id=None,
        purpose=Purpose.DELAYED_RETRY,
        not_before=NOW + timedelta(minutes=5),
        deadline=None,
        cancel_conditions=(),
        reservation={},
        state=ScheduleState.SCHEDULED,
        note="",
        created_by="agent",
        created_at=NOW,
    )
    values.update(overrides)
    return Schedule(**values)


def test_a_delay_counts_from_the_database_clock():
    assert eligibility(NOW, None, 90, None) == (NOW + timedelta(seconds=90), None)


def test_an_absolute_time_is_taken_as_given_even_when_past():
    past = NOW - timedelta(hours=1)
    assert eligibility(NOW, past, 0, None) == (past, None)


@pytest.mark.parametrize(
    ("not_before", "delay", "deadline", "field"),
    [
        (None, 0, None, "not_before"),  # neither
        (NOW, 5, None, "not_before"),  # both
        (None, -1, None, "delay_seconds"),
        (None, int(HORIZON_MAX.total_seconds()) + 1, None, "delay_seconds"),
        (NOW + HORIZON_MAX + timedelta(seconds=1), 0, None, "not_before"),
        (None, 60, NOW + timedelta(seconds=60), "deadline"),  # not after not_before
        (NOW - timedelta(hours=2), 0, NOW - timedelta(hours=1), "deadline"),  # passed
    ],
)
def test_bad_times_name_their_field(not_before, delay, deadline, field):
    with pytest.raises(InvalidArgument) as refused:
        eligibility(NOW, not_before, delay, deadline)
    assert [v.field for v in refused.value.violations] == [field]


def test_the_horizon_itself_is_allowed():
    assert eligibility(NOW, None, int(HORIZON_MAX.total_seconds()), None)[0] == NOW + HORIZON_MAX


def test_the_gate_refuses_until_not_before_and_not_after():
    waiting = schedule()
    refusal = gate_refusal(waiting, NOW)
    assert refusal is not None and refusal.code == "SCHEDULE_NOT_DUE" and "sch_1" in refusal.message
    assert gate_refusal(waiting, waiting.not_before - timedelta(microseconds=1)) is not None
    assert gate_refusal(waiting, waiting.not_before) is None  # due at the instant itself
    assert gate_refusal(replace(waiting, state=ScheduleState.DUE), NOW) is None  # fired: reconsider now
    for closed in (ScheduleState.CONSUMED, ScheduleState.CANCELLED, ScheduleState.EXPIRED):
        assert gate_refusal(replace(waiting, state=closed), NOW) is None
    assert gate_refusal(None, NOW) is None


def test_only_an_open_schedule_past_its_deadline_expires():
    lapsing = schedule(deadline=NOW + timedelta(minutes=10))
    assert not expired(lapsing, NOW + timedelta(minutes=9))
    assert expired(lapsing, NOW + timedelta(minutes=10))
    assert expired(replace(lapsing, state=ScheduleState.DUE), NOW + timedelta(minutes=11))
    assert not expired(replace(lapsing, state=ScheduleState.CONSUMED), NOW + timedelta(minutes=11))
    assert not expired(schedule(), NOW + timedelta(days=399))  # no deadline


def test_a_resume_cancels_only_open_unlisted_schedules_that_ask_for_it():
    asking = schedule(cancel_conditions=(CancelCondition.RUN_RESUMED,))
    assert resume_cancels(asking, listed=set())
    assert not resume_cancels(asking, listed={"sch_1"})
    assert not resume_cancels(schedule(), listed=set())  # did not ask
    assert not resume_cancels(replace(asking, state=ScheduleState.CANCELLED), listed=set())


def test_the_checkpoint_section_names_eligibility_clock_hold_and_conditions():
    section = schedule(
        reservation={"usd_cents": 5},
        cancel_conditions=(CancelCondition.EFFECT_SUCCEEDED,),
        deadline=NOW + timedelta(hours=1),
    ).as_section()
    assert section["next_eligibility"] == "2026-12-01T14:05:00.000000Z"
    assert section["deadline"] == "2026-12-01T15:00:00.000000Z"
    assert section["governing_clock"] == "database"
    assert section["reservation"] == {"usd_cents": 5}
    assert section["cancel_conditions"] == ["EFFECT_SUCCEEDED"]
