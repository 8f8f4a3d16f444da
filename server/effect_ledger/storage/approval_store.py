"""Approval queries: requests, votes, the ordered event feed, and consumption."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.approvals import Approval, ApprovalState, Vote
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.model import Role
from effect_ledger.storage.dialect import insert_ignoring_conflict, is_postgresql
from effect_ledger.storage.schema import (
    approval_events,
    approval_votes,
    approvals,
    principals,
    tenant_counters,
)
from effect_ledger.storage.statements import prepared

APPROVAL_SEQUENCE = "approval_events"


def _approval(row: Row[Any], votes: list[Vote]) -> Approval:
    return Approval(
        approval_id=row.approval_id,
        run_id=row.run_id,
        tool=row.tool,
        tool_revision=row.tool_revision,
        target=row.target,
        intent_digest=row.intent_digest,
        arguments=json.loads(row.arguments),
        requested_by=row.requested_by,
        state=ApprovalState(row.state),
        reusable=row.reusable,
        quorum=row.quorum,
        reason=row.reason,
        created_at=row.created_at,
        expires_at=row.expires_at,
        updated_at=row.updated_at,
        votes=votes,
        consumed_by_attempt=row.consumed_by_attempt,
        revoked_by=row.revoked_by,
        revoke_reason=row.revoke_reason,
    )


async def _votes(connection: AsyncConnection, tenant_id: str, ids: list[str]) -> dict[str, list[Vote]]:
    found: dict[str, list[Vote]] = {approval_id: [] for approval_id in ids}
    if not ids:
        return found
    rows = (
        await connection.execute(
            select(approval_votes)
            .where(approval_votes.c.tenant_id == tenant_id, approval_votes.c.approval_id.in_(ids))
            .order_by(approval_votes.c.created_at, approval_votes.c.reviewer_id)
        )
    ).all()
    for row in rows:
        found[row.approval_id].append(Vote(row.reviewer_id, row.approve, row.comment, row.created_at))
    return found


async def _load(
    connection: AsyncConnection, tenant_id: str, where: Any, *, lock: bool, limit: int | None = None
) -> list[Approval]:
    query = select(approvals).where(approvals.c.tenant_id == tenant_id, where).order_by(approvals.c.approval_id)
    if limit is not None:
        query = query.limit(limit)
    if lock:
        query = query.with_for_update()
    rows = (await connection.execute(query)).all()
    votes = await _votes(connection, tenant_id, [row.approval_id for row in rows])
    return [_approval(row, votes[row.approval_id]) for row in rows]


async def get(connection: AsyncConnection, tenant_id: str, approval_id: str, *, lock: bool) -> Approval | None:
    found = await _load(connection, tenant_id, approvals.c.approval_id == approval_id, lock=lock)
    return found[0] if found else None


async def for_intent(
    connection: AsyncConnection, tenant_id: str, run_id: str, intent_digest: str, *, lock: bool, limit: int = 50
) -> list[Approval]:
    """Every approval of this run for this digest (newest last), locked when about to consume."""
    if lock:
        return await _load(
            connection,
            tenant_id,
            and_(approvals.c.run_id == run_id, approvals.c.intent_digest == intent_digest),
            lock=True,
            limit=limit,
        )
    query = prepared(
        "approvals_for_intent",
        "",
        lambda: (
            select(approvals)
            .where(
                approvals.c.tenant_id == bindparam("tenant_id"),
                approvals.c.run_id == bindparam("run_id"),
                approvals.c.intent_digest == bindparam("intent_digest"),
            )
            .order_by(approvals.c.approval_id)
            .limit(bindparam("limit"))
        ),
    )
    rows = (
        await connection.execute(
            query, {"tenant_id": tenant_id, "run_id": run_id, "intent_digest": intent_digest, "limit": limit}
        )
    ).all()
    if not rows:
        return []
    votes = await _votes(connection, tenant_id, [row.approval_id for row in rows])
    return [_approval(row, votes[row.approval_id]) for row in rows]


async def lock_intent(connection: AsyncConnection, tenant_id: str, run_id: str, intent_digest: str) -> None:
    """Serialize finding-or-creating the request for one intent across replicas, until commit.

    Row locks cannot do it (there is no row yet, and a statement does not see rows committed
    after it started): PostgreSQL takes a transaction-scoped advisory lock on the intent;
    SQLite's BEGIN IMMEDIATE already serializes writers.
    """
    if not is_postgresql(connection):
        return
    name = "\0".join(("approval-intent", tenant_id, run_id, intent_digest)).encode()
    key = int.from_bytes(hashlib.sha256(name).digest()[:8], "big", signed=True)
    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


async def listed(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    run_id: str,
    state: str,
    tool: str,
    after_id: str,
    limit: int,
) -> list[Approval]:
    conditions = [approvals.c.approval_id > after_id]
    if run_id:
        conditions.append(approvals.c.run_id == run_id)
    if tool:
        conditions.append(approvals.c.tool == tool)
    if state:
        conditions.append(approvals.c.state == state)
    return await _load(connection, tenant_id, and_(*conditions), lock=False, limit=limit)


async def open_requests(connection: AsyncConnection, tenant_id: str, now: datetime, up_to: int) -> int:
    """How many of the tenant's requests are PENDING and not expired, counted up to ``up_to``
    (a quota check reads no further than its limit)."""
    pending = (
        select(approvals.c.approval_id)
        .where(approvals.c.tenant_id == tenant_id, approvals.c.state == "PENDING", approvals.c.expires_at > now)
        .limit(up_to)
        .subquery()
    )
    return int((await connection.execute(select(func.count()).select_from(pending))).scalar_one())


async def insert_approval(connection: AsyncConnection, tenant_id: str, approval: Approval) -> None:
    await connection.execute(
        insert(approvals).values(
            tenant_id=tenant_id,
            approval_id=approval.approval_id,
            run_id=approval.run_id,
            tool=approval.tool,
            tool_revision=approval.tool_revision,
            target=approval.target,
            intent_digest=approval.intent_digest,
            arguments=canonical_bytes(approval.arguments).decode(),
            requested_by=approval.requested_by,
            state=approval.state.value,
            reusable=approval.reusable,
            quorum=approval.quorum,
            reason=approval.reason,
            created_at=approval.created_at,
            expires_at=approval.expires_at,
            updated_at=approval.updated_at,
            consumed_by_attempt="",
            revoked_by="",
            revoke_reason="",
        )
    )


async def save_state(connection: AsyncConnection, tenant_id: str, approval: Approval) -> None:
    await connection.execute(
        update(approvals)
        .where(approvals.c.tenant_id == tenant_id, approvals.c.approval_id == approval.approval_id)
        .values(
            state=approval.state.value,
            quorum=approval.quorum,
            updated_at=approval.updated_at,
            consumed_by_attempt=approval.consumed_by_attempt,
            revoked_by=approval.revoked_by,
            revoke_reason=approval.revoke_reason,
        )
    )


async def consume(
    connection: AsyncConnection, tenant_id: str, approval_id: str, attempt_id: str, now: datetime
) -> bool:
    """APPROVED -> CONSUMED, only if still APPROVED: of concurrent consumers exactly one wins."""
    result = await connection.execute(
        update(approvals)
        .where(
            approvals.c.tenant_id == tenant_id,
            approvals.c.approval_id == approval_id,
            approvals.c.state == ApprovalState.APPROVED.value,
        )
        .values(state=ApprovalState.CONSUMED.value, consumed_by_attempt=attempt_id, updated_at=now)
    )
    return result.rowcount == 1


async def insert_vote(connection: AsyncConnection, tenant_id: str, approval_id: str, vote: Vote) -> None:
    await connection.execute(
        insert(approval_votes).values(
            tenant_id=tenant_id,
            approval_id=approval_id,
            reviewer_id=vote.reviewer_id,
            approve=vote.approve,
            comment=vote.comment,
            created_at=vote.created_at,
        )
    )


async def reviewers_with_authority(
    connection: AsyncConnection, tenant_id: str, reviewer_ids: set[str]
) -> frozenset[str]:
    """Of these principals, those who hold the reviewer or admin role now and are not disabled."""
    if not reviewer_ids:
        return frozenset()
    rows = (
        await connection.execute(
            select(principals.c.principal_id, principals.c.roles).where(
                principals.c.tenant_id == tenant_id,
                principals.c.principal_id.in_(sorted(reviewer_ids)),
                principals.c.disabled_at.is_(None),
            )
        )
    ).all()
    deciding = {Role.REVIEWER.value, Role.ADMIN.value}
    return frozenset(row.principal_id for row in rows if deciding & set(json.loads(row.roles)))


async def next_sequence(connection: AsyncConnection, tenant_id: str, name: str) -> int:
    """The next value of a per-tenant counter; holds the counter's row lock until commit."""
    updated = (
        await connection.execute(
            update(tenant_counters)
            .where(tenant_counters.c.tenant_id == tenant_id, tenant_counters.c.name == name)
            .values(value=tenant_counters.c.value + 1)
            .returning(tenant_counters.c.value)
        )
    ).scalar_one_or_none()
    if updated is not None:
        return updated

    inserted = (
        await connection.execute(
            insert_ignoring_conflict(connection, tenant_counters)
            .values(tenant_id=tenant_id, name=name, value=1)
            .on_conflict_do_nothing(index_elements=["tenant_id", "name"])
            .returning(tenant_counters.c.value)
        )
    ).scalar_one_or_none()
    if inserted is not None:
        return inserted
    return await next_sequence(connection, tenant_id, name)


async def append_event(
    connection: AsyncConnection, tenant_id: str, approval: Approval, event_type: str, principal_id: str, now: datetime
) -> int:
    sequence = await next_sequence(connection, tenant_id, APPROVAL_SEQUENCE)
    await connection.execute(
        insert(approval_events).values(
            tenant_id=tenant_id,
            sequence=sequence,
            approval_id=approval.approval_id,
            run_id=approval.run_id,
            tool=approval.tool,
            type=event_type,
            principal_id=principal_id,
            created_at=now,
        )
    )
    return sequence


async def events_after(
    connection: AsyncConnection, tenant_id: str, after_sequence: int, run_id: str, tool: str, limit: int
) -> list[Row[Any]]:
    conditions = [approval_events.c.tenant_id == tenant_id, approval_events.c.sequence > after_sequence]
    if run_id:
        conditions.append(approval_events.c.run_id == run_id)
    if tool:
        conditions.append(approval_events.c.tool == tool)
    return list(
        (
            await connection.execute(
                select(approval_events).where(*conditions).order_by(approval_events.c.sequence).limit(limit)
            )
        ).all()
    )


async def latest_sequences(connection: AsyncConnection, tenant_ids: list[str]) -> dict[str, int]:
    """Each tenant's last approval event sequence, from its counter (a primary-key lookup):
    every event up to it is committed, because the counter row stays locked until commit."""
    if not tenant_ids:
        return {}
    rows = (
        await connection.execute(
            select(tenant_counters.c.tenant_id, tenant_counters.c.value).where(
                tenant_counters.c.name == APPROVAL_SEQUENCE, tenant_counters.c.tenant_id.in_(tenant_ids)
            )
        )
    ).all()
    return {row.tenant_id: row.value for row in rows}
