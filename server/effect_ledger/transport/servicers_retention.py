"""The Retention servicer: rules, legal holds, and the collector on demand."""

from __future__ import annotations

import time

from effect_ledger.domain.model import Principal
from effect_ledger.domain.retention import Kind, Rule
from effect_ledger.service import retention
from effect_ledger.storage.engine import UnitOfWork
from effect_ledger.storage.retention_store import HoldRecord
from effect_ledger.transport import mapping, roles
from effect_ledger.transport.servicers import Application, encode_token
from effectledger.v1 import retention_pb2, retention_pb2_grpc


def kind_from_proto(value: int) -> Kind:
    kind: Kind = mapping.enum_value(retention_pb2.RetentionKind, value, "kind", Kind)
    return kind


def rule_to_proto(rule: Rule) -> retention_pb2.RetentionRule:
    return retention_pb2.RetentionRule(
        kind=retention_pb2.RetentionKind.Value(rule.kind.value),
        max_age_seconds=rule.max_age_seconds,
        updated_by=rule.updated_by,
        updated_at=mapping.timestamp(rule.updated_at),
    )


def hold_to_proto(hold: HoldRecord) -> retention_pb2.LegalHold:
    return retention_pb2.LegalHold(
        run_id=hold.run_id,
        reason=hold.reason,
        placed_by=hold.placed_by,
        placed_at=mapping.timestamp(hold.placed_at),
        released_by=hold.released_by or "",
        released_at=mapping.timestamp(hold.released_at),
    )


async def _caller(_unit: UnitOfWork, caller: Principal) -> Principal:
    return caller


class RetentionServicer(retention_pb2_grpc.RetentionServicer):
    def __init__(self, app: Application, age_min_seconds: int) -> None:
        self.app = app
        self.age_min_seconds = age_min_seconds

    async def PutRetentionRule(self, request, context):
        kind = kind_from_proto(request.kind)
        rule = await self.app.call(
            context,
            roles.of("Retention", "PutRetentionRule"),
            lambda unit, caller: retention.put_rule(unit, caller, kind, request.max_age_seconds, self.age_min_seconds),
        )
        return rule_to_proto(rule)

    async def ListRetentionRules(self, request, context):
        found = await self.app.call(
            context,
            roles.of("Retention", "ListRetentionRules"),
            lambda unit, caller: retention.list_rules(unit, caller),
        )
        return retention_pb2.ListRetentionRulesResponse(rules=[rule_to_proto(rule) for rule in found])

    async def PlaceLegalHold(self, request, context):
        hold = await self.app.call(
            context,
            roles.of("Retention", "PlaceLegalHold"),
            lambda unit, caller: retention.place_hold(unit, caller, request.run_id, request.reason),
        )
        return hold_to_proto(hold)

    async def ReleaseLegalHold(self, request, context):
        hold = await self.app.call(
            context,
            roles.of("Retention", "ReleaseLegalHold"),
            lambda unit, caller: retention.release_hold(unit, caller, request.run_id),
        )
        return hold_to_proto(hold)

    async def ListLegalHolds(self, request, context):
        size, after = self.app.page(request)
        found = await self.app.call(
            context,
            roles.of("Retention", "ListLegalHolds"),
            lambda unit, caller: retention.list_holds(unit, caller, after, size, request.include_released),
        )
        return retention_pb2.ListLegalHoldsResponse(
            holds=[hold_to_proto(hold) for hold in found],
            next_page_token=encode_token(found[-1].run_id) if len(found) == size else "",
        )

    async def CollectRetention(self, request, context):
        # The role check in a unit of its own; the collection then runs in batches, one
        # transaction each, within the caller's tenant.
        caller = await self.app.call(context, roles.of("Retention", "CollectRetention"), _caller)
        remaining = context.time_remaining()
        seconds = retention.CALL_SECONDS_MAX if remaining is None else min(retention.CALL_SECONDS_MAX, remaining / 2)
        counts = await retention.collect(
            self.app.database,
            caller.tenant_id,
            caller.principal_id,
            dry_run=request.dry_run,
            batches_max=retention.BATCHES_PER_CALL_MAX,
            stop_at=time.monotonic() + seconds,
        )
        return retention_pb2.CollectRetentionResponse(
            trace_events=counts.removed[Kind.TRACE],
            decisions=counts.removed[Kind.DECISIONS],
            artifacts=counts.removed[Kind.ARTIFACTS],
            snapshots=counts.removed[Kind.SNAPSHOTS],
            tombstones_written=counts.tombstones_written,
            more=counts.more,
        )
