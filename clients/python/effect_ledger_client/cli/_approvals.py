"""``approvals list|show|approve|deny|revoke|watch``."""

from __future__ import annotations

import time
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
from effect_ledger_client.cli._render import APPROVAL, APPROVAL_EVENT
from effect_ledger_client.cli._values import ApprovalState
from effect_ledger_client.errors import DeadlineExceeded
from effect_ledger_client.proto import approvals_pb2

approvals = group("Approvals: list and decide the requests for human approval, and follow them.")

ApprovalId = Annotated[str, typer.Argument(metavar="APPROVAL_ID", help="The approval's id.")]
# Without --seconds, a watch asks for a stream this long and opens the next one when it ends.
WATCH_STREAM_SECONDS = 3600.0
# A server ends long streams itself; a watch opens at most this many in a row.
WATCH_STREAMS_MAX = 100_000


@command(approvals, "list")
def list_approvals(
    ctl: Ctl,
    state: Annotated[
        ApprovalState | None, typer.Option(case_sensitive=False, help="Only approvals in this state.")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Only approvals of this run.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only approvals of this tool.")] = None,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's approvals (ListApprovals)."""
    request = approvals_pb2.ListApprovalsRequest(
        state=state.value if state else None, run_id=run or "", tool=tool or ""
    )
    found = ctl.collect(ctl.ledger.approvals.ListApprovals, request, "approvals", limit=limit, page_size=page_size)
    ctl.printer.items(found, APPROVAL, "approvals")


@command(approvals, "show")
def show_approval(ctl: Ctl, approval_id: ApprovalId) -> None:
    """One approval: the intent it is bound to, its arguments and votes (GetApproval)."""
    approval = ctl.ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))
    ctl.printer.item(approval, APPROVAL)


@command(approvals, "approve")
def approve(
    ctl: Ctl,
    approval_id: ApprovalId,
    reason: Annotated[str | None, typer.Option(help="A comment kept with the vote.")] = None,
) -> None:
    """Vote for an approval (DecideApproval). It is approved once `quorum` reviewers agree."""
    request = approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment=reason or "")
    ctl.printer.item(ctl.ledger.approvals.DecideApproval(request), APPROVAL)


@command(approvals, "deny")
def deny(
    ctl: Ctl,
    approval_id: ApprovalId,
    reason: Annotated[str, typer.Option(help="Why: kept with the vote, shown to the requester.")],
) -> None:
    """Deny an approval (DecideApproval): one reviewer's no decides."""
    request = approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=False, comment=reason)
    ctl.printer.item(ctl.ledger.approvals.DecideApproval(request), APPROVAL)


@command(approvals, "revoke")
def revoke(
    ctl: Ctl,
    approval_id: ApprovalId,
    reason: Annotated[str, typer.Option(help="Why the approval no longer holds.")],
) -> None:
    """Revoke an approval (RevokeApproval): it enables nothing from now on."""
    request = approvals_pb2.RevokeApprovalRequest(approval_id=approval_id, reason=reason)
    ctl.printer.item(ctl.ledger.approvals.RevokeApproval(request), APPROVAL)


@command(approvals, "watch")
def watch(
    ctl: Ctl,
    run: Annotated[str | None, typer.Option(help="Only events of this run.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only events of this tool.")] = None,
    after_sequence: Annotated[
        int, typer.Option(min=0, help="Events after this sequence number (0: from the tenant's first event).")
    ] = 0,
    max_events: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    seconds: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
) -> None:
    """Print approval events as they happen (WatchApprovals), one a line (-o json: one JSON
    object a line), until interrupted, --max-events or --seconds."""
    deadline = time.monotonic() + seconds if seconds is not None else None
    request = approvals_pb2.WatchApprovalsRequest(after_sequence=after_sequence, run_id=run or "", tool=tool or "")
    try:
        follow(ctl, request, deadline, max_events)
    except KeyboardInterrupt:
        pass  # the way to end a watch without a limit


def follow(
    ctl: Ctl, request: approvals_pb2.WatchApprovalsRequest, deadline: float | None, max_events: int | None
) -> None:
    """Streams after stream, each resumed from the last sequence printed, until the deadline
    or ``max_events``."""
    printed = 0
    for _ in range(WATCH_STREAMS_MAX):
        remaining = deadline - time.monotonic() if deadline is not None else WATCH_STREAM_SECONDS
        if remaining <= 0 or (max_events is not None and printed >= max_events):
            return
        stream = ctl.ledger.approvals.WatchApprovals(request, timeout=remaining)
        try:
            for event in stream:
                ctl.printer.event(event, APPROVAL_EVENT)
                request.after_sequence = event.sequence
                printed += 1
                if max_events is not None and printed >= max_events:
                    return
        except DeadlineExceeded:
            pass  # this stream's time is up; the loop checks the watch's own
        finally:
            stream.cancel()
