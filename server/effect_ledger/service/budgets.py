"""Budgets: put, read, record provider usage; reserve on ALLOW and settle on outcome."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from effect_ledger.domain import budgets as rules
from effect_ledger.domain.budgets import Budget, Reservation, ReservationState, Scope
from effect_ledger.domain.contracts import check_identifier, check_text
from effect_ledger.domain.model import Attempt, Principal
from effect_ledger.errors import InvalidArgument, NotFound
from effect_ledger.storage import budget_store as store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork

RESET_PERIOD_SECONDS_MAX = 10 * 366 * 86_400
OPEN_RESERVATIONS_SHOWN_MAX = 500


class Settlement(StrEnum):
    POST = "POST"  # SUCCEEDED: post actual usage (or the estimate), release the rest
    VOID = "VOID"  # definitely did not happen: release everything
    EXPIRE = "EXPIRE"  # lease ran out before any dispatch: release, marked expired


async def known_dimensions(unit: UnitOfWork, tenant_id: str) -> frozenset[str]:
    return rules.STANDARD_DIMENSIONS | await store.known_dimensions(unit.connection, tenant_id)


async def dimensions_for(unit: UnitOfWork, tenant_id: str, amounts: dict[str, int]) -> frozenset[str]:
    """The known dimensions, asking the database only when a custom name needs checking."""
    if set(amounts) <= rules.STANDARD_DIMENSIONS:
        return rules.STANDARD_DIMENSIONS
    return await known_dimensions(unit, tenant_id)


async def put_budget(
    unit: UnitOfWork,
    principal: Principal,
    scope: Scope,
    scope_id: str,
    dimension: str,
    limit: int,
    reset_period_seconds: int,
) -> Budget:
    rules.check_dimension(dimension, "dimension")
    rules.check_amount(limit, "limit")
    if not 0 <= reset_period_seconds <= RESET_PERIOD_SECONDS_MAX:
        raise InvalidArgument.field("reset_period_seconds", f"must be between 0 and {RESET_PERIOD_SECONDS_MAX}")
    if scope == Scope.TENANT:
        if scope_id:
            raise InvalidArgument.field("scope_id", "must be empty for the TENANT scope")
    else:
        check_identifier(scope_id, "scope_id")
        if await repo.get_run(unit.connection, principal.tenant_id, scope_id) is None:
            raise NotFound("run", scope_id)
    await store.upsert_budget(
        unit.connection,
        principal.tenant_id,
        budget_id=repo.new_id("bud"),
        scope=scope,
        scope_id=scope_id,
        dimension=dimension,
        limit=limit,
        reset_period_seconds=reset_period_seconds or None,
        now=unit.now,
    )
    found = await store.budgets_of_scope(unit.connection, principal.tenant_id, scope, scope_id, unit.now)
    return next(b for b in found if b.dimension == dimension)


async def get_budget(
    unit: UnitOfWork, principal: Principal, scope: Scope, scope_id: str
) -> tuple[list[Budget], list[Reservation]]:
    if scope == Scope.TENANT:
        if scope_id:
            raise InvalidArgument.field("scope_id", "must be empty for the TENANT scope")
    else:
        check_identifier(scope_id, "scope_id")
    found = await store.budgets_of_scope(unit.connection, principal.tenant_id, scope, scope_id, unit.now)
    if not found:
        raise NotFound("budget", f"{scope.value}/{scope_id}")
    open_reservations = await store.open_reservations(
        unit.connection, principal.tenant_id, [b.budget_id for b in found], OPEN_RESERVATIONS_SHOWN_MAX
    )
    return found, open_reservations


@dataclass(frozen=True)
class UsageReport:
    run_id: str
    provider: str
    model: str
    segment: str
    usage: dict[str, int]
    request_id: str


async def record_usage(unit: UnitOfWork, principal: Principal, report: UsageReport) -> tuple[str, list[Budget]]:
    """A fact: recorded and posted even when it crosses a limit (the budget then reads exhausted).

    Cumulative across provider and model changes: a new segment never refunds earlier ones.
    """
    check_identifier(report.run_id, "run_id")
    for field, value in (("provider", report.provider), ("model", report.model), ("segment", report.segment)):
        check_text(value, field, required=field != "segment", length_max=128 if field != "segment" else 256)
    if report.request_id:
        check_identifier(report.request_id, "request_id")
    if not report.usage:
        raise InvalidArgument.field("usage", "is required", reason="FIELD_REQUIRED")
    usage = rules.validate_amounts(report.usage, "usage", await dimensions_for(unit, principal.tenant_id, report.usage))
    run = await repo.get_run(unit.connection, principal.tenant_id, report.run_id)
    if run is None:
        raise NotFound("run", report.run_id)
    tenant = principal.tenant_id
    applicable = await store.applicable_budgets(unit.connection, tenant, run.run_id, run.root_run_id, unit.now)
    if report.request_id:
        existing = await store.usage_by_request(unit.connection, tenant, report.request_id)
        if existing is not None:
            return existing, applicable
    usage_id = repo.new_id("use")
    await store.insert_usage(
        unit.connection,
        tenant,
        usage_id=usage_id,
        run_id=run.run_id,
        provider=report.provider,
        model=report.model,
        segment=report.segment,
        usage=usage,
        request_id=report.request_id or None,
        principal_id=principal.principal_id,
        now=unit.now,
    )
    for budget in sorted(applicable, key=lambda b: b.budget_id):
        amount = usage.get(budget.dimension, 0)
        if amount:
            if rules.posting_overflows(budget, amount) or not await store.move(
                unit.connection, tenant, budget.budget_id, pending_delta=0, posted_delta=amount, now=unit.now
            ):
                raise _overflow(f"usage[{budget.dimension!r}]")
    unit.record_event(
        tenant,
        run.run_id,
        "usage.recorded",
        {
            "usage_id": usage_id,
            "provider": report.provider,
            "model": report.model,
            "segment": report.segment,
            "usage": usage,
        },
        principal.principal_id,
    )
    return usage_id, await store.applicable_budgets(unit.connection, tenant, run.run_id, run.root_run_id, unit.now)


# --- used by the gate ----------------------------------------------------------------------


async def reserve(
    unit: UnitOfWork,
    tenant_id: str,
    applicable: list[Budget],
    estimate: dict[str, int],
    attempt_id: str,
    effect_id: str,
) -> tuple[list[str], str | None]:
    """Reserve the estimate in every applicable budget; (reservation ids, exhausted dimension).

    Runs inside a savepoint: when one budget cannot take its share, none keeps a reservation.
    """
    needed = rules.reservations_needed(applicable, estimate)
    if not needed:
        return [], None
    savepoint = await unit.connection.begin_nested()
    reservation_ids = []
    for budget, amount in needed:
        if not await store.reserve(unit.connection, tenant_id, budget.budget_id, amount, unit.now):
            await savepoint.rollback()
            return [], budget.dimension
        reservation_id = repo.new_id("res")
        await store.insert_reservation(
            unit.connection,
            tenant_id,
            Reservation(
                reservation_id,
                budget.budget_id,
                attempt_id,
                effect_id,
                budget.dimension,
                amount,
                ReservationState.PENDING,
                0,
                unit.now,
                None,
            ),
        )
        reservation_ids.append(reservation_id)
    await savepoint.commit()
    return reservation_ids, None


async def settle(
    unit: UnitOfWork, tenant_id: str, attempts: list[Attempt], how: Settlement, usage: dict[str, int] | None = None
) -> list[Reservation]:
    """Settle the pending reservations of attempts whose outcome is now known; returns them."""
    return await settle_holders(unit, tenant_id, [a.attempt_id for a in attempts], how, usage)


async def release_holder(unit: UnitOfWork, tenant_id: str, holder_id: str) -> list[Reservation]:
    """Void what one holder (an attempt, or a scheduled intent: ``sch_...``) still has reserved."""
    return await settle_holders(unit, tenant_id, [holder_id], Settlement.VOID)


async def settle_holders(
    unit: UnitOfWork, tenant_id: str, holder_ids: list[str], how: Settlement, usage: dict[str, int] | None = None
) -> list[Reservation]:
    """Settle the pending reservations made for these holders (attempt or schedule ids)."""
    if not holder_ids:
        return []
    pending = await store.pending_reservations_of_attempts(unit.connection, tenant_id, holder_ids)
    for reservation in pending:
        if how == Settlement.POST:
            posted = rules.settle_amount(reservation, usage)
            state = ReservationState.POSTED
        else:
            posted = 0
            state = ReservationState.VOIDED if how == Settlement.VOID else ReservationState.EXPIRED
        if await store.settle_reservation(
            unit.connection, tenant_id, reservation.reservation_id, state, posted, unit.now
        ):
            if not await store.move(
                unit.connection,
                tenant_id,
                reservation.budget_id,
                pending_delta=-reservation.amount,
                posted_delta=posted,
                now=unit.now,
            ):
                reported = usage is not None and reservation.dimension in usage
                raise _overflow(
                    f"succeeded.usage[{reservation.dimension!r}]"
                    if reported
                    else f"estimate[{reservation.dimension!r}]"
                )
    return pending


async def post_unreserved_usage(
    unit: UnitOfWork, tenant_id: str, run_id: str, usage: dict[str, int], reserved_dimensions: set[str]
) -> None:
    """Reported usage in dimensions nothing was reserved for is still a fact: post it."""
    extra = {d: a for d, a in usage.items() if d not in reserved_dimensions and a > 0}
    if not extra:
        return
    run = await repo.get_run(unit.connection, tenant_id, run_id)
    assert run is not None
    for budget in await store.applicable_budgets(unit.connection, tenant_id, run.run_id, run.root_run_id, unit.now):
        if extra.get(budget.dimension):
            if not await store.move(
                unit.connection,
                tenant_id,
                budget.budget_id,
                pending_delta=0,
                posted_delta=extra[budget.dimension],
                now=unit.now,
            ):
                raise _overflow(f"succeeded.usage[{budget.dimension!r}]")


def _overflow(field: str) -> InvalidArgument:
    """Posting that would overflow a budget's 64-bit counter: refused, the transaction rolled back."""
    return InvalidArgument.field(field, "would overflow the budget's 64-bit counter", reason="AMOUNT_OVERFLOW")


async def post_expired_estimates(unit: UnitOfWork, tenant_id: str, attempts: list[Attempt]) -> None:
    """An attempt whose reservation expired (never dispatched, lease ran out) turned out to have
    happened after all: its estimate is posted as a fact (the reservation stays EXPIRED)."""
    for reservation in await store.expired_reservations_of_attempts(
        unit.connection, tenant_id, [a.attempt_id for a in attempts]
    ):
        if not await store.move(
            unit.connection,
            tenant_id,
            reservation.budget_id,
            pending_delta=0,
            posted_delta=reservation.amount,
            now=unit.now,
        ):
            raise _overflow(f"estimate[{reservation.dimension!r}]")
