"""``schedules list|show|cancel|watch``."""

from __future__ import annotations

from typing import Annotated

import typer

from effect_ledger_client.cli._app import (
    LIMIT_DEFAULT,
    PAGE_SIZE_DEFAULT,
    Ctl,
    Limit,
    PageSize,
    command,
    group,
)
from effect_ledger_client.cli._render import DUE_INTENT, SCHEDULE
from effect_ledger_client.cli._values import ScheduleState
from effect_ledger_client.cli._watch import deadline_of, follow
from effect_ledger_client.proto import schedules_pb2

schedules = group("Schedules: the intents agents set to reconsider an effect later, and those that fall due.")

ScheduleId = Annotated[str, typer.Argument(metavar="SCHEDULE_ID", help="The schedule's id.")]


@command(schedules, "list")
def list_schedules(
    ctl: Ctl,
    run: Annotated[str | None, typer.Option(help="Only the schedules of this run.")] = None,
    state: Annotated[
        ScheduleState | None, typer.Option(case_sensitive=False, help="Only schedules in this state.")
    ] = None,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's schedules, newest first (ListSchedules)."""
    request = schedules_pb2.ListSchedulesRequest(run_id=run or "", state=state.value if state else None)
    found = ctl.collect(ctl.ledger.schedules.ListSchedules, request, "schedules", limit=limit, page_size=page_size)
    ctl.printer.items(found, SCHEDULE, "schedules")


@command(schedules, "show")
def show_schedule(ctl: Ctl, schedule_id: ScheduleId) -> None:
    """One schedule: its intent, eligibility, deadline, hold, firing and closing (GetSchedule)."""
    schedule = ctl.ledger.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=schedule_id))
    ctl.printer.item(schedule, SCHEDULE)


@command(schedules, "cancel")
def cancel_schedule(
    ctl: Ctl,
    schedule_id: ScheduleId,
    reason: Annotated[str, typer.Option(help="Why: kept as the schedule's close reason.")],
) -> None:
    """Cancel an open schedule and release the budget it holds (CancelSchedule)."""
    request = schedules_pb2.CancelScheduleRequest(schedule_id=schedule_id, reason=reason)
    ctl.printer.item(ctl.ledger.schedules.CancelSchedule(request), SCHEDULE)


@command(schedules, "watch")
def watch(
    ctl: Ctl,
    run: Annotated[str | None, typer.Option(help="Only the schedules of this run.")] = None,
    after_sequence: Annotated[
        int, typer.Option(min=0, help="Intents due after this sequence number (0: from the tenant's first).")
    ] = 0,
    max_events: Annotated[int | None, typer.Option(min=1, help="Stop after this many due intents.")] = None,
    seconds: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
) -> None:
    """Print schedules as they fall due (WatchDueIntents), in firing order, one a line (-o json:
    one JSON object a line), until interrupted, --max-events or --seconds."""
    request = schedules_pb2.WatchDueIntentsRequest(run_id=run or "", after_sequence=after_sequence)
    try:
        follow(ctl, ctl.ledger.schedules.WatchDueIntents, request, DUE_INTENT, deadline_of(seconds), max_events)
    except KeyboardInterrupt:
        pass  # the way to end a watch without a limit
