"""The Approvals and Budgets servicers."""

from __future__ import annotations

import asyncio

from effect_ledger.domain.approvals import DECIDING_ROLES
from effect_ledger.domain.budgets import Scope
from effect_ledger.domain.model import Role
from effect_ledger.errors import InvalidArgument, LedgerError
from effect_ledger.service import approvals, budgets
from effect_ledger.service.approvals import ApprovalRequest, ApprovalSettings
from effect_ledger.storage import approval_store
from effect_ledger.transport import mapping, status
from effect_ledger.transport.servicers import (
    ADMINS,
    AGENTS,
    AGENTS_AND_ADMINS,
    EVERY_ROLE,
    Application,
    decode_token,
    encode_token,
)
from effectledger.v1 import approvals_pb2, approvals_pb2_grpc, budgets_pb2, budgets_pb2_grpc

DECIDERS = frozenset(DECIDING_ROLES)
REVOKERS = frozenset({Role.REVIEWER, Role.ADMIN, Role.AGENT})
WATCH_POLL_SECONDS = 0.2
WATCH_BATCH_MAX = 100


class ApprovalsServicer(approvals_pb2_grpc.ApprovalsServicer):
    def __init__(self, app: Application, settings: ApprovalSettings) -> None:
        self.app = app
        self.settings = settings

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
            return mapping.approval_to_proto(await approvals.request_approval(unit, principal, command, self.settings), unit.now)

        return await self.app.call(context, AGENTS, work)

    async def GetApproval(self, request, context):
        async def work(unit, principal):
            return mapping.approval_to_proto(await approvals.get(unit, principal, request.approval_id), unit.now)

        return await self.app.call(context, EVERY_ROLE, work)

    async def ListApprovals(self, request, context):
        limits = self.app.limits
        size = self.app.page_size(request.page_size, limits.page_size_default, limits.page_size_max)
        after = decode_token(request.page_token)
        state = mapping.approval_state_filter(request.state)

        async def work(unit, principal):
            found = await approvals.list_approvals(
                unit, principal, run_id=request.run_id, state=state, tool=request.tool, after_id=after, limit=size
            )
            return approvals_pb2.ListApprovalsResponse(
                approvals=[mapping.approval_to_proto(a, unit.now) for a in found],
                next_page_token=encode_token(found[-1].approval_id) if len(found) == size else "",
            )

        return await self.app.call(context, EVERY_ROLE, work)

    async def DecideApproval(self, request, context):
        async def work(unit, principal):
            decided = await approvals.decide(unit, principal, request.approval_id, request.approve, request.comment)
            return mapping.approval_to_proto(decided, unit.now)

        return await self.app.call(context, DECIDERS, work)

    async def RevokeApproval(self, request, context):
        async def work(unit, principal):
            revoked = await approvals.revoke(unit, principal, request.approval_id, request.reason)
            return mapping.approval_to_proto(revoked, unit.now)

        return await self.app.call(context, REVOKERS, work)

    async def WatchApprovals(self, request, context):
        """Every approval event after the cursor, in order; then new ones as they commit.

        The caller's token and role are checked again on every poll (current facts). The stream
        ends with the caller's deadline or cancellation; resume with the last sequence received.
        """
        if request.after_sequence < 0:
            await context.abort_with_status(
                status.to_status(InvalidArgument.field("after_sequence", "must not be negative"))
            )
        cursor = request.after_sequence
        while True:
            try:
                batch = await self.app.call(
                    context, EVERY_ROLE, lambda unit, principal, after=cursor: self._batch(unit, principal, after, request)
                )
            except LedgerError as error:
                await context.abort_with_status(status.to_status(error))
            for event in batch:
                cursor = event.sequence
                yield event
            if len(batch) < WATCH_BATCH_MAX:
                await asyncio.sleep(WATCH_POLL_SECONDS)

    async def _batch(self, unit, principal, cursor, request):
        rows = await approval_store.events_after(
            unit.connection, principal.tenant_id, cursor, request.run_id, request.tool, WATCH_BATCH_MAX
        )
        events = []
        cache = {}
        for row in rows:
            approval = cache.get(row.approval_id) or await approval_store.get(
                unit.connection, principal.tenant_id, row.approval_id, lock=False
            )
            cache[row.approval_id] = approval
            events.append(
                approvals_pb2.ApprovalEvent(
                    sequence=row.sequence,
                    type=row.type,
                    approval=mapping.approval_to_proto(approval, unit.now),
                    principal_id=row.principal_id,
                    created_at=mapping.timestamp(row.created_at),
                )
            )
        return events


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

        return await self.app.call(context, ADMINS, work)

    async def GetBudget(self, request, context):
        scope = mapping.scope_from_proto(request.scope)

        async def work(unit, principal):
            found, open_reservations = await budgets.get_budget(unit, principal, scope, request.scope_id)
            return budgets_pb2.GetBudgetResponse(
                budgets=[mapping.budget_to_proto(b) for b in found],
                open_reservations=[mapping.reservation_to_proto(r) for r in open_reservations],
            )

        return await self.app.call(context, EVERY_ROLE, work)

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

        return await self.app.call(context, AGENTS_AND_ADMINS, work)


__all__ = ["ApprovalsServicer", "BudgetsServicer", "Scope"]
