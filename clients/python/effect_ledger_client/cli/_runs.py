"""``runs list|show|trace``."""

from __future__ import annotations

from typing import Annotated

import typer

from effect_ledger_client.cli._app import (
    LIMIT_DEFAULT,
    PAGE_SIZE_DEFAULT,
    PAGES_MAX,
    Ctl,
    Limit,
    PageSize,
    Since,
    Until,
    command,
    group,
)
from effect_ledger_client.cli._render import RUN, RUN_EVENT
from effect_ledger_client.cli._values import created_range
from effect_ledger_client.proto import runs_pb2

runs = group("Runs: an agent's runs and their hash-chained traces.")

RunId = Annotated[str, typer.Argument(metavar="RUN_ID", help="The run's id.")]
# ListRunEvents pages hold up to 1000 events.
EVENTS_PAGE_SIZE_MAX = 1000


@command(runs, "list")
def list_runs(
    ctl: Ctl,
    label: Annotated[str | None, typer.Option(help="Only runs carrying this label: KEY, or KEY=VALUE.")] = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's runs, oldest first (ListRuns)."""
    key, _, value = (label or "").partition("=")
    request = runs_pb2.ListRunsRequest(label_key=key, label_value=value)
    created_range(request, since, until)
    found = ctl.collect(ctl.ledger.runs.ListRuns, request, "runs", limit=limit, page_size=page_size)
    ctl.printer.items(found, RUN, "runs")


@command(runs, "show")
def show_run(ctl: Ctl, run_id: RunId) -> None:
    """One run: its configuration, labels and trace head (GetRun)."""
    ctl.printer.item(ctl.ledger.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)), RUN)


@command(runs, "trace")
def trace_run(
    ctl: Ctl,
    run_id: RunId,
    after_revision: Annotated[int, typer.Option(min=0, help="Events after this revision.")] = 0,
    limit: Limit = LIMIT_DEFAULT,
    page_size: Annotated[
        int, typer.Option("--page-size", min=1, max=EVENTS_PAGE_SIZE_MAX, help="How many to ask for per call.")
    ] = 200,
) -> None:
    """The run's trace in revision order (ListRunEvents): each event carries the hash of the one
    before it."""
    request = runs_pb2.ListRunEventsRequest(run_id=run_id, after_revision=after_revision)
    events: list[runs_pb2.RunEvent] = []
    for _ in range(PAGES_MAX):
        request.page_size = min(page_size, limit - len(events))
        response = ctl.ledger.runs.ListRunEvents(request)
        events.extend(response.events)
        request.after_revision = response.next_after_revision
        if not response.next_after_revision or len(events) >= limit:
            break
    if response.next_after_revision:
        ctl.printer.note(
            f"note: stopped at --limit {limit}; there are more events (--after-revision {events[limit - 1].revision})"
        )
    ctl.printer.items(events[:limit], RUN_EVENT, "events")
