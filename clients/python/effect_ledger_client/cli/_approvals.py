"""``approvals list|show|approve|deny|revoke|watch``."""

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
from effect_ledger_client.cli._render import APPROVAL, APPROVAL_EVENT
from effect_ledger_client.cli._values import ApprovalState
from effect_ledger_client.cli._watch import deadline_of, follow
from effect_ledger_client.proto import approvals_pb2

approvals = group("Approvals: list and decide the requests for human approval, and follow them.")

ApprovalId = Annotated[str, typer.Argument(metavar="APPROVAL_ID", help="The approval's id.")]


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
    from_now: Annotated[
        bool, typer.Option("--from-now", help="Only events from now on (not with --after-sequence).")
    ] = False,
    max_events: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    seconds: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
) -> None:
    """Print approval events as they happen (WatchApprovals), one a line (-o json: one JSON
    object a line), until interrupted, --max-events or --seconds."""
    request = approvals_pb2.WatchApprovalsRequest(
        after_sequence=after_sequence, run_id=run or "", tool=tool or "", from_now=from_now
    )
    try:
        follow(ctl, ctl.ledger.approvals.WatchApprovals, request, APPROVAL_EVENT, deadline_of(seconds), max_events)
    except KeyboardInterrupt:
        pass  # the way to end a watch without a limit
