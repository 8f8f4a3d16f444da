"""Tenant-wide reads: ListEffects, ListRuns, ListDecisions, ListBudgets.

Each is a keyset page in id order (creation order: ids begin with their creation time). A
filter the database cannot judge exactly (an effect's stage after a lease ran out, a label
match) is applied after the read; a page then scans at most ``SCAN_ROUNDS_MAX`` batches and may
come back short with a cursor to go on from, so no request reads without bound.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from effect_ledger.domain import budgets as budget_rules
from effect_ledger.domain.budgets import Budget, Scope
from effect_ledger.domain.contracts import (
    TARGET_LENGTH_MAX,
    check_identifier,
    check_text,
    check_tool_name,
)
from effect_ledger.domain.model import Decision, Effect, Outcome, Principal, Run, Stage
from effect_ledger.errors import InvalidArgument
from effect_ledger.service.leases import record_expiries
from effect_ledger.storage import budget_store
from effect_ledger.storage import query_store as store
from effect_ledger.storage.engine import UnitOfWork

T = TypeVar("T")

SCAN_ROUNDS_MAX = 4
LABEL_KEY_LENGTH_MAX = 63
LABEL_VALUE_LENGTH_MAX = 256
# A stored AUTHORIZED or DISPATCHED effect whose lease ran out is shown UNKNOWN.
_MAY_BECOME_UNKNOWN = (Stage.AUTHORIZED, Stage.DISPATCHED)


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    # The id to continue after; "" when nothing is left.
    next_after: str


@dataclass(frozen=True)
class CreatedRange:
    after: datetime | None = None
    before: datetime | None = None

    def check(self) -> None:
        if self.after is not None and self.before is not None and self.before <= self.after:
            raise InvalidArgument.field("created_before", "must be later than created_after", reason="INVALID_RANGE")


# One batch: what it keeps, the last id it read, and whether the table has nothing after it.
Batch = tuple[list[T], str, bool]


async def _collect(
    fetch: Callable[[str], Awaitable[Batch[T]]], key: Callable[[T], str], after: str, limit: int
) -> Page[T]:
    found: list[T] = []
    cursor = after
    for _ in range(SCAN_ROUNDS_MAX):
        kept, cursor, exhausted = await fetch(cursor)
        found.extend(kept)
        if len(found) >= limit:
            found = found[:limit]
            return Page(found, key(found[-1]))
        if exhausted:
            return Page(found, "")
    return Page(found, cursor)


def _check_run_and_tool(run_id: str, tool: str) -> None:
    if run_id:
        check_identifier(run_id, "run_id")
    if tool:
        check_tool_name(tool)


async def list_effects(
    unit: UnitOfWork,
    principal: Principal,
    *,
    stages: frozenset[Stage],
    tool: str,
    run_id: str,
    target: str,
    created: CreatedRange,
    after_id: str,
    limit: int,
) -> Page[Effect]:
    """The tenant's effects as a read shows them: an expired lease is recorded (like GetEffect)
    and the stage filter judges the stage after that."""
    _check_run_and_tool(run_id, tool)
    if target:
        check_text(target, "target", required=True, length_max=TARGET_LENGTH_MAX)
    created.check()
    stored = set(stages)
    if Stage.UNKNOWN in stages:
        stored.update(_MAY_BECOME_UNKNOWN)
    stored_values = sorted(s.value for s in stored)

    async def fetch(cursor: str) -> Batch[Effect]:
        page = await store.effects_page(
            unit.connection,
            principal.tenant_id,
            stages=stored_values,
            tool=tool,
            run_id=run_id,
            target=target,
            created_after=created.after,
            created_before=created.before,
            after_id=cursor,
            limit=limit,
        )
        if not page:
            return [], cursor, True
        shown = await record_expiries(unit, principal.tenant_id, page)
        kept = [e for e in shown if not stages or e.stage in stages]
        return kept, page[-1].effect_id, len(page) < limit

    return await _collect(fetch, lambda effect: effect.effect_id, after_id, limit)


async def list_runs(
    unit: UnitOfWork,
    principal: Principal,
    *,
    label_key: str,
    label_value: str,
    created: CreatedRange,
    after_id: str,
    limit: int,
) -> Page[Run]:
    """The tenant's runs; with ``label_key``, those carrying that label (with ``label_value``
    when set; an empty value matches any)."""
    if label_key:
        check_text(label_key, "label_key", required=True, length_max=LABEL_KEY_LENGTH_MAX)
    elif label_value:
        raise InvalidArgument.field("label_value", "needs label_key", reason="FIELD_REQUIRED")
    check_text(label_value, "label_value", required=False, length_max=LABEL_VALUE_LENGTH_MAX)
    created.check()

    def matches(run: Run) -> bool:
        if not label_key:
            return True
        value = run.labels.get(label_key)
        return value is not None and (not label_value or value == label_value)

    async def fetch(cursor: str) -> Batch[Run]:
        page = await store.runs_page(
            unit.connection,
            principal.tenant_id,
            label_key=label_key,
            label_value=label_value,
            created_after=created.after,
            created_before=created.before,
            after_id=cursor,
            limit=limit,
        )
        if not page:
            return [], cursor, True
        return [r for r in page if matches(r)], page[-1].run_id, len(page) < limit

    return await _collect(fetch, lambda run: run.run_id, after_id, limit)


async def list_decisions(
    unit: UnitOfWork,
    principal: Principal,
    *,
    outcome: Outcome | None,
    reason_code: str,
    run_id: str,
    tool: str,
    after_id: str,
    limit: int,
) -> Page[Decision]:
    """The tenant's decisions, without their policy input (GetDecision returns it)."""
    _check_run_and_tool(run_id, tool)
    if reason_code:
        check_identifier(reason_code, "reason")

    async def fetch(cursor: str) -> Batch[Decision]:
        page = await store.decisions_page(
            unit.connection,
            principal.tenant_id,
            outcome=outcome.value if outcome else "",
            reason_code=reason_code,
            run_id=run_id,
            tool=tool,
            after_id=cursor,
            limit=limit,
        )
        return page, page[-1].decision_id if page else cursor, len(page) < limit

    return await _collect(fetch, lambda decision: decision.decision_id, after_id, limit)


async def list_budgets(
    unit: UnitOfWork,
    principal: Principal,
    *,
    scope: Scope | None,
    scope_id: str,
    dimension: str,
    exhausted_only: bool,
    after_id: str,
    limit: int,
) -> Page[Budget]:
    """The tenant's budgets as GetBudget shows them (in their current period); "exhausted" is
    judged after a period rolls over, so it is applied after the read."""
    if scope == Scope.TENANT and scope_id:
        raise InvalidArgument.field("scope_id", "must be empty for the TENANT scope")
    if scope_id:
        check_identifier(scope_id, "scope_id")
    if dimension:
        budget_rules.check_dimension(dimension, "dimension")

    async def fetch(cursor: str) -> Batch[Budget]:
        page = await budget_store.budgets_page(
            unit.connection,
            principal.tenant_id,
            scope=scope,
            scope_id=scope_id,
            dimension=dimension,
            after_id=cursor,
            limit=limit,
            now=unit.now,
        )
        if not page:
            return [], cursor, True
        kept = [b for b in page if b.exhausted] if exhausted_only else page
        return kept, page[-1].budget_id, len(page) < limit

    return await _collect(fetch, lambda budget: budget.budget_id, after_id, limit)
