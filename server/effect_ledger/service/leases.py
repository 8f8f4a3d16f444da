"""Leases: judged by the database clock read after the effect row is locked (docs/decisions.md,
"Whose clock decides a lease"), and recorded when they run out: by the writer that finds them,
by a read that would show them, or by the sweeper."""

from __future__ import annotations

from effect_ledger.domain import lifecycle
from effect_ledger.domain.gate_rules import (
    expired_in_memory,
)
from effect_ledger.domain.model import (
    Attempt,
    Effect,
    Principal,
    Stage,
)
from effect_ledger.errors import (
    NotFound,
)
from effect_ledger.service import budgets
from effect_ledger.service.budgets import Settlement
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork

SYSTEM_SWEEPER = "system:lease-sweeper"


async def save_effect(unit: UnitOfWork, tenant_id: str, effect: Effect, attempts: list[Attempt]) -> None:
    for attempt in attempts:
        await repo.save_attempt(unit.connection, tenant_id, attempt)
    await repo.save_effect_state(unit.connection, tenant_id, effect)


async def lease_seconds_of(unit: UnitOfWork, tenant_id: str, effect: Effect) -> int:
    contract = await repo.contract_revision(unit.connection, tenant_id, effect.tool, effect.tool_revision)
    assert contract is not None, "an effect's pinned contract revision is never deleted"
    return contract.lease_seconds


def adopt_clock(unit: UnitOfWork, locked: repo.LockedEffect | None) -> Effect | None:
    """Judge the locked effect's leases by the clock read after its lock was granted.

    A clock read before the lock (the authentication query's) may be older than a commit the
    lock waited for, and a lease judged by it may be live for this writer while a reader has
    already shown it run out: one lease, two answers. From here on the unit uses the later time
    for every judgment, for the leases it starts and for the records it writes.
    """
    if locked is None:
        return None
    if locked.now > unit.now:
        unit.now = locked.now
    return locked.effect


async def expire_leases(unit: UnitOfWork, tenant_id: str, effect: Effect, principal_id: str) -> int:
    """Expire leases by the database clock: record each expiry in the trace, save it, and let
    go of the money of attempts that were never dispatched (a dispatched one keeps it held)."""
    changed = expired_in_memory(effect, unit.now)
    for attempt, previous in changed:
        unit.record_event(
            tenant_id,
            effect.run_id,
            "attempt.lease_expired",
            {
                "effect_id": effect.effect_id,
                "attempt_id": attempt.attempt_id,
                "from": previous.value,
                "lease_expires_at": attempt.lease_expires_at.isoformat(),
            },
            principal_id,
        )
    if changed:
        await save_effect(unit, tenant_id, effect, [attempt for attempt, _ in changed])
        never_dispatched = [attempt for attempt, previous in changed if previous == Stage.AUTHORIZED]
        await budgets.settle(unit, tenant_id, never_dispatched, Settlement.EXPIRE)
    return len(changed)


async def locked_effect(unit: UnitOfWork, principal: Principal, effect_id: str) -> Effect:
    effect = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, principal.tenant_id, effect_id))
    if effect is None:
        raise NotFound("effect", effect_id)
    await expire_leases(unit, principal.tenant_id, effect, principal.principal_id)
    return effect


async def record_expiries(unit: UnitOfWork, tenant_id: str, found: list[Effect]) -> list[Effect]:
    """What a read shows: an effect whose lease ran out by the read's clock is locked, judged
    again by the clock read after its lock, and the expiry recorded before the read answers.
    So an attempt a read has shown UNKNOWN is UNKNOWN in the ledger, and a late dispatch
    cannot revive it."""
    shown = []
    for effect in found:
        if any(lifecycle.lease_expired(attempt, unit.now) for attempt in effect.attempts):
            locked = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, tenant_id, effect.effect_id))
            if locked is None:
                continue
            await expire_leases(unit, tenant_id, locked, SYSTEM_SWEEPER)
            effect = locked
        shown.append(effect)
    return shown


async def sweep_expired_leases(unit: UnitOfWork, tenant_id: str, effect_id: str) -> int:
    """Record lease expiries of one effect (background sweeper); returns how many expired."""
    effect = adopt_clock(unit, await repo.lock_effect_by_id(unit.connection, tenant_id, effect_id))
    if effect is None:
        return 0
    return await expire_leases(unit, tenant_id, effect, SYSTEM_SWEEPER)
