"""The Approvals and Budgets servicers."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from effect_ledger.domain.budgets import Scope
from effect_ledger.errors import InvalidArgument, LedgerError
from effect_ledger.service import approvals, budgets, queries
from effect_ledger.service.approvals import ApprovalRequest, ApprovalSettings
from effect_ledger.storage.notifications import FeedWakeups
from effect_ledger.transport import mapping, roles, status
from effect_ledger.transport.servicers import Application, encode_token
from effectledger.v1 import approvals_pb2, approvals_pb2_grpc, budgets_pb2, budgets_pb2_grpc

WATCH_BATCH_MAX = 100


class ApprovalsServicer(approvals_pb2_grpc.ApprovalsServicer):
    def __init__(self, app: Application, settings: ApprovalSettings) -> None:
        self.app = app
        self.settings = settings
        # Wakes the WatchApprovals streams; its task (``feed.run()``) runs with the server.
        self.feed = FeedWakeups(app.database)

    async def RequestApproval(self, request, context):
        command = ApprovalRequest(
            run_id=request.run_id,
            tool=request.tool,
            arguments_json=request.arguments_json,
            target=request.target,
            reason=request.reason,
            reusable=request.reusable,
            ttl_seconds=request.ttl_seconds,
        )

        async def work(unit, principal):
            return mapping.approval_to_proto(
                await approvals.request_approval(unit, principal, command, self.settings), unit.now
            )

        return await self.app.call(context, roles.of("Approvals", "RequestApproval"), work)

    async def GetApproval(self, request, context):
        async def work(unit, principal):
            return mapping.approval_to_proto(await approvals.get(unit, principal, request.approval_id), unit.now)

        return await self.app.call(context, roles.of("Approvals", "GetApproval"), work)

    async def ListApprovals(self, request, context):
        size, after = self.app.page(request)
        state = mapping.approval_state_filter(request.state)

        async def work(unit, principal):
            found = await approvals.list_approvals(
                unit, principal, run_id=request.run_id, state=state, tool=request.tool, after_id=after, limit=size
            )
            return approvals_pb2.ListApprovalsResponse(
                approvals=[mapping.approval_to_proto(a, unit.now) for a in found],
                next_page_token=encode_token(found[-1].approval_id) if len(found) == size else "",
            )

        return await self.app.call(context, roles.of("Approvals", "ListApprovals"), work)

    async def DecideApproval(self, request, context):
        async def work(unit, principal):
            decided = await approvals.decide(unit, principal, request.approval_id, request.approve, request.comment)
            return mapping.approval_to_proto(decided, unit.now)

        return await self.app.call(context, roles.of("Approvals", "DecideApproval"), work)

    async def RevokeApproval(self, request, context):
        async def work(unit, principal):
            revoked = await approvals.revoke(unit, principal, request.approval_id, request.reason)
            return mapping.approval_to_proto(revoked, unit.now)

        return await self.app.call(context, roles.of("Approvals", "RevokeApproval"), work)

    async def WatchApprovals(self, request, context):
        """Every approval event after the cursor, in order; then new ones as they commit.

        Each read authenticates the caller again (current token and role) and reads what the
        database committed. Between reads the stream waits for a wake-up (``FeedWakeups``) and
        does no database work. It ends with the caller's deadline or cancellation; resume with
        the last sequence received. At most ``WATCHERS_MAX`` streams per process.
        """
        if request.after_sequence < 0:
            await context.abort_with_status(
                status.to_status(InvalidArgument.field("after_sequence", "must not be negative"))
            )
        after_sequence = request.after_sequence
        if request.from_now:
            if after_sequence:
                await context.abort_with_status(
                    status.to_status(InvalidArgument.field("from_now", "cannot be combined with after_sequence"))
                )
            after_sequence = await self._latest(context)
        with self.feed.watching(after_sequence) as watcher:
            if watcher is None:
                await context.abort_with_status(watchers_exhausted_status(self.feed.watchers_max))
            while True:
                announced_before = watcher.begin_read()
                tenant_id, batch = await self._read(context, request, watcher.scanned)
                complete = len(batch) < WATCH_BATCH_MAX
                watcher.finish_read(tenant_id, batch[-1].sequence if batch else None, announced_before, complete)
                for event in batch:
                    yield event
                if complete:
                    await watcher.wait()

    async def _latest(self, context) -> int:
        try:
            return await self.app.call(
                context,
                roles.of("Approvals", "WatchApprovals"),
                lambda unit, principal: approvals.latest_sequence(unit, principal),
            )
        except LedgerError as error:
            await context.abort_with_status(status.to_status(error))
            raise  # abort_with_status raises; this line is never reached

    async def _read(self, context, request, cursor: int):
        try:
            return await self.app.call(
                context,
                roles.of("Approvals", "WatchApprovals"),
                lambda unit, principal: self._batch(unit, principal, cursor, request),
            )
        except LedgerError as error:
            await context.abort_with_status(status.to_status(error))

    async def _batch(self, unit, principal, cursor, request):
        found = await approvals.feed_after(
            unit, principal, cursor, run_id=request.run_id, tool=request.tool, limit=WATCH_BATCH_MAX
        )
        events = [
            approvals_pb2.ApprovalEvent(
                sequence=event.sequence,
                type=event.type,
                approval=mapping.approval_to_proto(event.approval, unit.now),
                principal_id=event.principal_id,
                created_at=mapping.timestamp(event.created_at),
            )
            for event in found
        ]
        return principal.tenant_id, events


def watchers_exhausted_status(watchers_max: int) -> grpc.Status:
    """RESOURCE_EXHAUSTED with ErrorInfo and QuotaFailure: the process's streams are all taken.
    (The error table maps domain errors of a unit of work; this refusal happens before one.)"""
    description = f"at most {watchers_max} WatchApprovals streams are open per server process"
    details = [
        error_details_pb2.ErrorInfo(
            reason="WATCHERS_EXHAUSTED", domain=status.ERROR_DOMAIN, metadata={"watchers_max": str(watchers_max)}
        ),
        error_details_pb2.QuotaFailure(
            violations=[error_details_pb2.QuotaFailure.Violation(subject="WatchApprovals", description=description)]
        ),
    ]
    packed = []
    for detail in details:
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)
        packed.append(any_detail)
    return rpc_status.to_status(
        status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=description, details=packed)
    )


class BudgetsServicer(budgets_pb2_grpc.BudgetsServicer):
    def __init__(self, app: Application) -> None:
        self.app = app

    async def PutBudget(self, request, context):
        scope = mapping.scope_from_proto(request.scope)

        async def work(unit, principal):
            budget = await budgets.put_budget(
                unit, principal, scope, request.scope_id, request.dimension, request.limit, request.reset_period_seconds
            )
            return mapping.budget_to_proto(budget)

        return await self.app.call(context, roles.of("Budgets", "PutBudget"), work)

    async def GetBudget(self, request, context):
        scope = mapping.scope_from_proto(request.scope)

        async def work(unit, principal):
            found, open_reservations = await budgets.get_budget(unit, principal, scope, request.scope_id)
            return budgets_pb2.GetBudgetResponse(
                budgets=[mapping.budget_to_proto(b) for b in found],
                open_reservations=[mapping.reservation_to_proto(r) for r in open_reservations],
            )

        return await self.app.call(context, roles.of("Budgets", "GetBudget"), work)

    async def RecordUsage(self, request, context):
        report = budgets.UsageReport(
            run_id=request.run_id,
            provider=request.provider,
            model=request.model,
            segment=request.segment,
            usage=dict(request.usage),
            request_id=request.request_id,
        )

        async def work(unit, principal):
            usage_id, applicable = await budgets.record_usage(unit, principal, report)
            return budgets_pb2.RecordUsageResponse(
                usage_id=usage_id, budgets=[mapping.budget_to_proto(b) for b in applicable]
            )

        return await self.app.call(context, roles.of("Budgets", "RecordUsage"), work)

    async def ListBudgets(self, request, context):
        size, after = self.app.page(request)
        scope = mapping.scope_filter(request.scope)
        page = await self.app.call(
            context,
            roles.of("Budgets", "ListBudgets"),
            lambda unit, principal: queries.list_budgets(
                unit,
                principal,
                scope=scope,
                scope_id=request.scope_id,
                dimension=request.dimension,
                exhausted_only=request.exhausted_only,
                after_id=after,
                limit=size,
            ),
        )
        return budgets_pb2.ListBudgetsResponse(
            budgets=[mapping.budget_to_proto(b) for b in page.items],
            next_page_token=encode_token(page.next_after) if page.next_after else "",
        )


__all__ = ["ApprovalsServicer", "BudgetsServicer", "Scope"]
