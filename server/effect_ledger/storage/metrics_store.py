"""The reads behind the sampled gauges (observability/metrics.py), across tenants.

Two grouped counts, each returning at most ``tenants_max`` rows (the tenants with the most):

- open effects: the ``stage IN (AUTHORIZED, DISPATCHED, UNKNOWN)`` condition is the one of the
  partial index ``ix_effects_open_by_run``, so the count walks open effects only, however many
  settled ones the ledger keeps;
- pending approval requests (PENDING and not expired), with the oldest's creation time; a
  tenant holds at most ``--open-approval-requests-per-tenant-max`` of them.

Both run in one read-only unit of work under the pool's statement timeout.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.approvals import ApprovalState
from effect_ledger.domain.model import OPEN_STAGES, Stage
from effect_ledger.storage.schema import approvals, effects

# The same list, in the same order, as the partial index's condition.
_OPEN_STAGES = [Stage.AUTHORIZED.value, Stage.DISPATCHED.value, Stage.UNKNOWN.value]
assert set(_OPEN_STAGES) == {stage.value for stage in OPEN_STAGES}


async def sample(
    connection: AsyncConnection, now: datetime, tenants_max: int
) -> tuple[tuple[dict[str, tuple[int, int]], dict[str, tuple[int, float]]], datetime]:
    """((tenant -> (open effects, UNKNOWN effects), tenant -> (pending approval requests, age
    of the oldest in seconds)), the database's time)."""
    open_count = func.count()
    unknown_count = func.sum(case((effects.c.stage == Stage.UNKNOWN.value, 1), else_=0))
    effect_rows = await connection.execute(
        select(effects.c.tenant_id, open_count, unknown_count)
        .where(effects.c.stage.in_(_OPEN_STAGES))
        .group_by(effects.c.tenant_id)
        .order_by(open_count.desc(), effects.c.tenant_id)
        .limit(tenants_max)
    )
    by_tenant = {row[0]: (int(row[1]), int(row[2] or 0)) for row in effect_rows}
    pending_count = func.count()
    approval_rows = await connection.execute(
        select(approvals.c.tenant_id, pending_count, func.min(approvals.c.created_at))
        .where(approvals.c.state == ApprovalState.PENDING.value, approvals.c.expires_at > now)
        .group_by(approvals.c.tenant_id)
        .order_by(pending_count.desc(), approvals.c.tenant_id)
        .limit(tenants_max)
    )
    pending = {
        row[0]: (int(row[1]), max(0.0, (now - row[2]).total_seconds()) if row[2] is not None else 0.0)
        for row in approval_rows
    }
    return (by_tenant, pending), now
