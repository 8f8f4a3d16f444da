"""Scheduled intents over gRPC on a real server: refused until due by the database clock, fired
by the scheduler, reconsidered under the policy current then, released when they close."""

from __future__ import annotations

import time

from google.protobuf.timestamp_pb2 import Timestamp

from effectledger.v1 import budgets_pb2, gate_pb2, runs_pb2, schedules_pb2
from support import authorize_request, contract, new_run, new_tenant, outcome_name, raises_error, succeeded

ARGUMENTS = b'{"to":"bob@example.com","subject":"hello"}'
DUE_WAIT_SECONDS = 15.0


def schedule_request(run_id: str, key: str, **fields) -> schedules_pb2.ScheduleIntentRequest:
    fields.setdefault("purpose", schedules_pb2.DELAYED_RETRY)
    return schedules_pb2.ScheduleIntentRequest(
        run_id=run_id,
        tool="email.send",
        arguments_json=ARGUMENTS,
        idempotency_key=key,
        target="mailto:bob@example.com",
        **fields,
    )


def run_with_budget(agent, admin, *, estimate: int) -> str:
    """A run with a RUN budget of 100 usd_cents, and the tool's default estimate set to ``estimate``."""
    run_id = new_run(agent)
    admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id, dimension="usd_cents", limit=100)
    )
    request = contract()
    request.contract.default_estimate["usd_cents"] = estimate
    admin.tools.PutToolContract(request)
    return run_id


def codes(response) -> list[str]:
    return [reason.code for reason in response.reasons]


def wait_state(client, schedule_id: str, state: int, timeout: float = DUE_WAIT_SECONDS) -> schedules_pb2.Schedule:
    deadline = time.monotonic() + timeout
    while True:
        found = client.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=schedule_id))
        if found.state == state:
            return found
        assert time.monotonic() < deadline, f"still {schedules_pb2.ScheduleState.Name(found.state)}"
        time.sleep(0.1)


def test_a_scheduled_intent_is_refused_until_due_then_reconsidered_once(server, tenant, agent, admin):
    admin.tools.PutToolContract(contract(lease_seconds=60))
    run_id = new_run(agent)
    scheduled = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-1", delay_seconds=2, note="retry at 14:00"))
    assert scheduled.state == schedules_pb2.SCHEDULED and scheduled.clock == "database"
    assert scheduled.not_before.ToDatetime() > scheduled.created_at.ToDatetime()

    early = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    assert outcome_name(early) == "DENY" and codes(early)[0] == "SCHEDULE_NOT_DUE", early
    assert early.schedule_id == scheduled.schedule_id

    # The scheduler fires it once its time comes; a watcher of the run sees it.
    watch = agent.schedules.WatchDueIntents(
        schedules_pb2.WatchDueIntentsRequest(run_id=run_id), timeout=DUE_WAIT_SECONDS
    )
    due = next(iter(watch))
    watch.cancel()
    assert due.schedule.schedule_id == scheduled.schedule_id and due.schedule.state == schedules_pb2.DUE
    assert due.sequence >= 1 and due.schedule.fired_by

    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-1"))
    assert outcome_name(allowed) == "ALLOW" and allowed.schedule_id == scheduled.schedule_id
    consumed = agent.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=scheduled.schedule_id))
    assert consumed.state == schedules_pb2.SCHEDULE_CONSUMED and consumed.decision_id == allowed.decision_id

    # The trace names each step once.
    events = [e.type for e in agent.runs.ListRunEvents(_events(run_id)).events]
    assert [t for t in events if t.startswith("schedule.")] == ["schedule.created", "schedule.due", "schedule.consumed"]


def _events(run_id: str):
    return runs_pb2.ListRunEventsRequest(run_id=run_id, page_size=100)


def test_an_absolute_not_before_in_the_past_is_due_at_once_and_the_gate_fires_it(server, tenant, agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    scheduled = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-past", delay_seconds=1))
    time.sleep(1.2)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-past"))
    assert outcome_name(allowed) == "ALLOW" and allowed.schedule_id == scheduled.schedule_id
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-past"))
    assert again.schedule_id == ""  # consumed: it never answers twice


def test_a_held_reservation_is_the_contracts_estimate_and_cancelling_releases_it(server, tenant, agent, admin):
    run_id = run_with_budget(agent, admin, estimate=40)
    scheduled = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-held", delay_seconds=3600, hold_budget=True))
    assert dict(scheduled.reservation) == {"usd_cents": 40}
    held = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert held.budgets[0].pending == 40
    assert [r.attempt_id for r in held.open_reservations] == [scheduled.schedule_id]

    with raises_error("PERMISSION_DENIED", "SCHEDULE_NOT_OWNED"):
        tenant.add("agent-2", "agent")
        tenant.client(server, "agent-2").schedules.CancelSchedule(
            schedules_pb2.CancelScheduleRequest(schedule_id=scheduled.schedule_id, reason="not mine")
        )
    cancelled = agent.schedules.CancelSchedule(
        schedules_pb2.CancelScheduleRequest(schedule_id=scheduled.schedule_id, reason="the user gave up")
    )
    assert cancelled.state == schedules_pb2.SCHEDULE_CANCELLED and cancelled.closed_by == "agent"
    released = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert released.budgets[0].pending == 0 and not released.open_reservations
    # Closed: no longer refuses the key.
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(run_id, "k-held"))) == "ALLOW"
    with raises_error("FAILED_PRECONDITION", "SCHEDULE_CLOSED"):
        agent.schedules.CancelSchedule(
            schedules_pb2.CancelScheduleRequest(schedule_id=scheduled.schedule_id, reason="again")
        )


def test_a_deadline_expires_the_schedule_and_releases_what_it_held(server, tenant, agent, admin):
    run_id = run_with_budget(agent, admin, estimate=10)
    created = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-lapse", delay_seconds=1, hold_budget=True))
    deadline = created.not_before.ToDatetime().timestamp() + 1
    # A deadline one second after not_before (as a Timestamp); a second schedule for another key.
    lapsing = agent.schedules.ScheduleIntent(
        schedule_request(
            run_id,
            "k-lapse-2",
            delay_seconds=1,
            hold_budget=True,
            deadline=Timestamp(seconds=int(deadline) + 1),
        )
    )
    expired = wait_state(agent, lapsing.schedule_id, schedules_pb2.SCHEDULE_EXPIRED)
    assert expired.close_reason == "the deadline passed"
    budget = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert lapsing.schedule_id not in [r.attempt_id for r in budget.open_reservations]


def test_bad_schedules_are_refused_precisely(server, tenant, agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    with raises_error("INVALID_ARGUMENT", "SCHEDULE_TIME_REQUIRED"):
        agent.schedules.ScheduleIntent(schedule_request(run_id, "k-bad"))
    with raises_error("INVALID_ARGUMENT", "SCHEDULE_TIME_INVALID"):
        agent.schedules.ScheduleIntent(schedule_request(run_id, "k-bad", delay_seconds=500 * 86400))
    with raises_error("INVALID_ARGUMENT", "FIELD_REQUIRED"):
        agent.schedules.ScheduleIntent(schedule_request(run_id, "k-bad", delay_seconds=5, purpose=0))
    with raises_error("INVALID_ARGUMENT", "INVALID_ENUM"):
        agent.schedules.ScheduleIntent(schedule_request(run_id, "k-bad", delay_seconds=5, cancel_conditions=[9]))
    with raises_error("NOT_FOUND", "RUN_NOT_FOUND"):
        agent.schedules.ScheduleIntent(schedule_request("run-missing", "k-bad", delay_seconds=5))
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        admin.schedules.ScheduleIntent(schedule_request(run_id, "k-bad", delay_seconds=5))
    first = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-twice", delay_seconds=60))
    assert agent.schedules.ScheduleIntent(schedule_request(run_id, "k-twice", delay_seconds=90)) == first
    other = schedule_request(run_id, "k-twice", delay_seconds=60)
    other.arguments_json = b'{"to":"eve@example.com"}'
    with raises_error("FAILED_PRECONDITION", "SCHEDULE_EXISTS"):
        agent.schedules.ScheduleIntent(other)
    with raises_error("NOT_FOUND", "SCHEDULE_NOT_FOUND"):
        agent.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id="sch_missing"))


def test_a_schedule_whose_effect_succeeds_first_is_cancelled_by_its_condition(server, tenant, agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-done"))
    agent.gate.RecordDispatch(_dispatch(allowed.attempt_id))
    agent.gate.RecordOutcome(succeeded(allowed.attempt_id))
    with raises_error("FAILED_PRECONDITION", "EFFECT_ALREADY_SUCCEEDED"):
        agent.schedules.ScheduleIntent(schedule_request(run_id, "k-done", delay_seconds=1))

    # An effect still open when scheduled, then succeeded by another path before due.
    second = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-later"))
    scheduled = agent.schedules.ScheduleIntent(
        schedule_request(
            run_id,
            "k-later",
            delay_seconds=1,
            purpose=schedules_pb2.RECOVERY_CHECK,
            cancel_conditions=[schedules_pb2.CANCEL_WHEN_EFFECT_SUCCEEDED],
        )
    )
    assert scheduled.effect_id == second.effect_id
    agent.gate.RecordDispatch(_dispatch(second.attempt_id))
    agent.gate.RecordOutcome(succeeded(second.attempt_id))
    cancelled = wait_state(agent, scheduled.schedule_id, schedules_pb2.SCHEDULE_CANCELLED)
    assert "SUCCEEDED" in cancelled.close_reason and cancelled.closed_by == "scheduler"


def _dispatch(attempt_id: str):
    return gate_pb2.RecordDispatchRequest(attempt_id=attempt_id)


def test_the_list_pages_newest_first_and_filters_by_state(server, tenant, agent, admin):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    made = [
        agent.schedules.ScheduleIntent(schedule_request(run_id, f"k-list-{i}", delay_seconds=3600)).schedule_id
        for i in range(3)
    ]
    agent.schedules.CancelSchedule(schedules_pb2.CancelScheduleRequest(schedule_id=made[0], reason="changed plans"))
    page = agent.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(run_id=run_id, page_size=2))
    assert [s.schedule_id for s in page.schedules] == [made[2], made[1]] and page.next_page_token
    rest = agent.schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(run_id=run_id, page_size=2, page_token=page.next_page_token)
    )
    assert [s.schedule_id for s in rest.schedules] == [made[0]]
    cancelled = agent.schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(run_id=run_id, state=schedules_pb2.SCHEDULE_CANCELLED)
    )
    assert [s.schedule_id for s in cancelled.schedules] == [made[0]]


def test_another_tenant_sees_no_schedule(server, tenant, agent, admin, database_url):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    made = agent.schedules.ScheduleIntent(schedule_request(run_id, "k-mine", delay_seconds=3600))
    stranger = new_tenant(database_url).client(server, "agent")
    with raises_error("NOT_FOUND", "SCHEDULE_NOT_FOUND"):
        stranger.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=made.schedule_id))
    assert not stranger.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest()).schedules
    with raises_error("NOT_FOUND", "SCHEDULE_NOT_FOUND"):
        stranger.schedules.CancelSchedule(
            schedules_pb2.CancelScheduleRequest(schedule_id=made.schedule_id, reason="not mine")
        )


def test_malformed_ids_in_schedule_reads_are_invalid_arguments(agent):
    """A schedule id or run filter with NUL, a newline or an escape is INVALID_ARGUMENT
    (INVALID_ID) naming the field, never INTERNAL (PostgreSQL refuses NUL in text)."""
    bad = "run\x00\n\x1b[31m"

    def watch():
        import grpc

        from effect_ledger.client import error_from_rpc

        try:
            next(iter(agent.schedules.WatchDueIntents(schedules_pb2.WatchDueIntentsRequest(run_id=bad))))
        except grpc.RpcError as error:  # streams are not wrapped by LedgerClient
            raise error_from_rpc(error) from None

    calls = {
        "schedule_id": [
            lambda: agent.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=bad)),
            lambda: agent.schedules.CancelSchedule(schedules_pb2.CancelScheduleRequest(schedule_id=bad, reason="x")),
        ],
        "run_id": [
            lambda: agent.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(run_id=bad)),
            watch,
        ],
    }
    for field, made in calls.items():
        for call in made:
            with raises_error("INVALID_ARGUMENT", "INVALID_ID"):
                call()
            assert [violation.field for violation in raises_error.last.violations] == [field]
