"""Budget queries. The invariant ``posted + pending <= limit`` for reservations is enforced by a
conditional UPDATE: on PostgreSQL a concurrent updater of the same row waits for the row lock
and then re-checks the condition against the committed row, so two replicas can never both
take the last unit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, and_, bindparam, insert, or_, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.budgets import INT64_MAX, Budget, Reservation, ReservationState, Scope
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.storage.schema import budgets, reservations, usage_records
from effect_ledger.storage.statements import prepared


def _budget(row: Row[Any]) -> Budget:
    return Budget(
        budget_id=row.budget_id,
        scope=Scope(row.scope),
        scope_id=row.scope_id,
        dimension=row.dimension,
        limit=row.limit_amount,
        posted=row.posted,
        pending=row.pending,
        reset_period_seconds=row.reset_period_seconds,
        period_started_at=row.period_started_at,
        period_ends_at=row.period_ends_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _reservation(row: Row[Any]) -> Reservation:
    return Reservation(
        reservation_id=row.reservation_id,
        budget_id=row.budget_id,
        attempt_id=row.attempt_id,
        effect_id=row.effect_id,
        dimension=row.dimension,
        amount=row.amount,
        state=ReservationState(row.state),
        posted_amount=row.posted_amount,
        created_at=row.created_at,
        settled_at=row.settled_at,
    )


def _applicable(tenant_id: Any, run_id: Any, root_run_id: Any) -> Any:
    return and_(
        budgets.c.tenant_id == tenant_id,
        or_(
            budgets.c.scope == Scope.TENANT.value,
            and_(budgets.c.scope == Scope.RUN.value, budgets.c.scope_id == run_id),
            and_(budgets.c.scope == Scope.RUN_TREE.value, budgets.c.scope_id == root_run_id),
        ),
    )


async def applicable_budgets(
    connection: AsyncConnection, tenant_id: str, run_id: str, root_run_id: str, now: datetime
) -> list[Budget]:
    """The budgets that apply to a run (tenant, run, and the run's tree), periods rolled over."""
    query = prepared(
        "applicable_budgets",
        "",
        lambda: (
            select(budgets)
            .where(_applicable(bindparam("tenant_id"), bindparam("run_id"), bindparam("root_run_id")))
            .order_by(budgets.c.budget_id)
        ),
    )
    parameters = {"tenant_id": tenant_id, "run_id": run_id, "root_run_id": root_run_id}
    found = [_budget(row) for row in (await connection.execute(query, parameters)).all()]
    if any(b.period_ends_at is not None and b.period_ends_at <= now for b in found):
        await roll_over_periods(connection, _applicable(tenant_id, run_id, root_run_id), now)
        found = [_budget(row) for row in (await connection.execute(query, parameters)).all()]
    return found


async def roll_over_periods(connection: AsyncConnection, where: Any, now: datetime) -> None:
    """Start a new period for budgets whose period ended: posted restarts at 0, pending stays."""
    due = (
        await connection.execute(
            select(
                budgets.c.tenant_id, budgets.c.budget_id, budgets.c.reset_period_seconds, budgets.c.period_ends_at
            ).where(where, budgets.c.period_ends_at.is_not(None), budgets.c.period_ends_at <= now)
        )
    ).all()
    for row in due:
        period = timedelta(seconds=row.reset_period_seconds)
        ends_at = row.period_ends_at
        while ends_at <= now:
            ends_at += period
        await connection.execute(
            update(budgets)
            .where(
                budgets.c.tenant_id == row.tenant_id,
                budgets.c.budget_id == row.budget_id,
                budgets.c.period_ends_at == row.period_ends_at,  # another replica may have rolled it
            )
            .values(posted=0, period_started_at=ends_at - period, period_ends_at=ends_at, updated_at=now)
        )


async def known_dimensions(connection: AsyncConnection, tenant_id: str) -> frozenset[str]:
    rows = (
        await connection.execute(select(budgets.c.dimension).where(budgets.c.tenant_id == tenant_id).distinct())
    ).all()
    return frozenset(row.dimension for row in rows)


async def reserve(connection: AsyncConnection, tenant_id: str, budget_id: str, amount: int, now: datetime) -> bool:
    """pending += amount, only if posted + pending + amount <= limit. True when reserved."""
    query = prepared(
        "reserve",
        "",
        lambda: (
            update(budgets)
            .where(
                budgets.c.tenant_id == bindparam("where_tenant_id"),
                budgets.c.budget_id == bindparam("where_budget_id"),
                budgets.c.posted + budgets.c.pending + bindparam("amount", type_=BigInteger) <= budgets.c.limit_amount,
            )
            .values(pending=budgets.c.pending + bindparam("amount", type_=BigInteger), updated_at=bindparam("now"))
        ),
    )
    parameters = {"where_tenant_id": tenant_id, "where_budget_id": budget_id, "amount": amount, "now": now}
    return (await connection.execute(query, parameters)).rowcount == 1


async def move(
    connection: AsyncConnection, tenant_id: str, budget_id: str, *, pending_delta: int, posted_delta: int, now: datetime
) -> bool:
    """Settle: release pending and/or post usage (posting is a fact and may cross the limit).

    False, and nothing changed, when posting would overflow the 64-bit counter (PostgreSQL
    would fail the statement; SQLite would silently turn the counter into a float)."""
    query = prepared(
        "move",
        "",
        lambda: (
            update(budgets)
            .where(
                budgets.c.tenant_id == bindparam("where_tenant_id"),
                budgets.c.budget_id == bindparam("where_budget_id"),
                budgets.c.posted <= bindparam("posted_ceiling", type_=BigInteger),
            )
            .values(
                pending=budgets.c.pending + bindparam("pending_delta", type_=BigInteger),
                posted=budgets.c.posted + bindparam("posted_delta", type_=BigInteger),
                updated_at=bindparam("now"),
            )
        ),
    )
    parameters = {
        "where_tenant_id": tenant_id,
        "where_budget_id": budget_id,
        "posted_ceiling": INT64_MAX - max(posted_delta, 0),
        "pending_delta": pending_delta,
        "posted_delta": posted_delta,
        "now": now,
    }
    return (await connection.execute(query, parameters)).rowcount == 1


async def insert_reservation(connection: AsyncConnection, tenant_id: str, reservation: Reservation) -> None:
    await connection.execute(
        prepared("insert_reservation", "", lambda: insert(reservations)),
        dict(
            tenant_id=tenant_id,
            reservation_id=reservation.reservation_id,
            budget_id=reservation.budget_id,
            attempt_id=reservation.attempt_id,
            effect_id=reservation.effect_id,
            dimension=reservation.dimension,
            amount=reservation.amount,
            state=reservation.state.value,
            posted_amount=0,
            created_at=reservation.created_at,
            settled_at=None,
        ),
    )


async def pending_reservations_of_attempts(
    connection: AsyncConnection, tenant_id: str, attempt_ids: list[str]
) -> list[Reservation]:
    if not attempt_ids:
        return []
    query = prepared(
        "pending_reservations_of_attempts",
        "",
        lambda: (
            select(reservations)
            .where(
                reservations.c.tenant_id == bindparam("tenant_id"),
                reservations.c.attempt_id.in_(bindparam("attempt_ids", expanding=True)),
                reservations.c.state == ReservationState.PENDING.value,
            )
            .order_by(reservations.c.budget_id)
        ),
    )
    rows = (await connection.execute(query, {"tenant_id": tenant_id, "attempt_ids": list(attempt_ids)})).all()
    return [_reservation(row) for row in rows]


async def settle_reservation(
    connection: AsyncConnection,
    tenant_id: str,
    reservation_id: str,
    state: ReservationState,
    posted_amount: int,
    now: datetime,
) -> bool:
    """PENDING -> a final state, once: a reservation ends in exactly one of posted, voided, expired."""
    query = prepared(
        "settle_reservation",
        "",
        lambda: (
            update(reservations)
            .where(
                reservations.c.tenant_id == bindparam("where_tenant_id"),
                reservations.c.reservation_id == bindparam("where_reservation_id"),
                reservations.c.state == ReservationState.PENDING.value,
            )
            .values(state=bindparam("state"), posted_amount=bindparam("posted_amount"), settled_at=bindparam("now"))
        ),
    )
    parameters = {
        "where_tenant_id": tenant_id,
        "where_reservation_id": reservation_id,
        "state": state.value,
        "posted_amount": posted_amount,
        "now": now,
    }
    return (await connection.execute(query, parameters)).rowcount == 1


async def budgets_of_scope(
    connection: AsyncConnection, tenant_id: str, scope: Scope, scope_id: str, now: datetime
) -> list[Budget]:
    where = and_(budgets.c.tenant_id == tenant_id, budgets.c.scope == scope.value, budgets.c.scope_id == scope_id)
    await roll_over_periods(connection, where, now)
    rows = (await connection.execute(select(budgets).where(where).order_by(budgets.c.dimension))).all()
    return [_budget(row) for row in rows]


async def budgets_page(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    scope: Scope | None,
    scope_id: str,
    dimension: str,
    after_id: str,
    limit: int,
    now: datetime,
) -> list[Budget]:
    """One page of the tenant's budgets in budget_id order, each in its current period."""
    where = [budgets.c.tenant_id == tenant_id, budgets.c.budget_id > after_id]
    if scope is not None:
        where.append(budgets.c.scope == scope.value)
    if scope_id:
        where.append(budgets.c.scope_id == scope_id)
    if dimension:
        where.append(budgets.c.dimension == dimension)
    query = select(budgets).where(*where).order_by(budgets.c.budget_id).limit(limit)
    rows = (await connection.execute(query)).all()
    if any(row.period_ends_at is not None and row.period_ends_at <= now for row in rows):
        ids = [row.budget_id for row in rows]
        await roll_over_periods(connection, and_(budgets.c.tenant_id == tenant_id, budgets.c.budget_id.in_(ids)), now)
        rows = (
            await connection.execute(
                select(budgets)
                .where(budgets.c.tenant_id == tenant_id, budgets.c.budget_id.in_(ids))
                .order_by(budgets.c.budget_id)
            )
        ).all()
    return [_budget(row) for row in rows]


async def open_reservations(
    connection: AsyncConnection, tenant_id: str, budget_ids: list[str], limit: int
) -> list[Reservation]:
    if not budget_ids:
        return []
    rows = (
        await connection.execute(
            select(reservations)
            .where(
                reservations.c.tenant_id == tenant_id,
                reservations.c.budget_id.in_(budget_ids),
                reservations.c.state == ReservationState.PENDING.value,
            )
            .order_by(reservations.c.reservation_id)
            .limit(limit)
        )
    ).all()
    return [_reservation(row) for row in rows]


async def upsert_budget(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    budget_id: str,
    scope: Scope,
    scope_id: str,
    dimension: str,
    limit: int,
    reset_period_seconds: int | None,
    now: datetime,
) -> None:
    existing = (
        await connection.execute(
            select(budgets.c.budget_id)
            .where(
                budgets.c.tenant_id == tenant_id,
                budgets.c.scope == scope.value,
                budgets.c.scope_id == scope_id,
                budgets.c.dimension == dimension,
            )
            .with_for_update()
        )
    ).scalar_one_or_none()
    period_ends_at = now + timedelta(seconds=reset_period_seconds) if reset_period_seconds else None
    if existing is None:
        await connection.execute(
            insert(budgets).values(
                tenant_id=tenant_id,
                budget_id=budget_id,
                scope=scope.value,
                scope_id=scope_id,
                dimension=dimension,
                limit_amount=limit,
                posted=0,
                pending=0,
                reset_period_seconds=reset_period_seconds,
                period_started_at=now,
                period_ends_at=period_ends_at,
                created_at=now,
                updated_at=now,
            )
        )
        return
    await connection.execute(
        update(budgets)
        .where(budgets.c.tenant_id == tenant_id, budgets.c.budget_id == existing)
        .values(
            limit_amount=limit, reset_period_seconds=reset_period_seconds, period_ends_at=period_ends_at, updated_at=now
        )
    )


async def insert_usage(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    usage_id: str,
    run_id: str,
    provider: str,
    model: str,
    segment: str,
    usage: dict[str, int],
    request_id: str | None,
    principal_id: str,
    now: datetime,
) -> None:
    await connection.execute(
        insert(usage_records).values(
            tenant_id=tenant_id,
            usage_id=usage_id,
            run_id=run_id,
            provider=provider,
            model=model,
            segment=segment,
            usage=canonical_bytes(usage).decode(),
            request_id=request_id,
            principal_id=principal_id,
            recorded_at=now,
        )
    )


async def usage_by_request(connection: AsyncConnection, tenant_id: str, request_id: str) -> str | None:
    return (
        await connection.execute(
            select(usage_records.c.usage_id).where(
                usage_records.c.tenant_id == tenant_id, usage_records.c.request_id == request_id
            )
        )
    ).scalar_one_or_none()


async def expired_reservations_of_attempts(
    connection: AsyncConnection, tenant_id: str, attempt_ids: list[str]
) -> list[Reservation]:
    if not attempt_ids:
        return []
    rows = (
        await connection.execute(
            select(reservations).where(
                reservations.c.tenant_id == tenant_id,
                reservations.c.attempt_id.in_(attempt_ids),
                reservations.c.state == ReservationState.EXPIRED.value,
            )
        )
    ).all()
    return [_reservation(row) for row in rows]
