"""Retention rows: rules, legal holds, tombstones, and the collector's batched statements.

Each collecting statement takes one batch of candidates in a keyset order and changes exactly
those rows in the same transaction that writes their tombstones. On PostgreSQL candidates are
locked ``FOR UPDATE SKIP LOCKED``, so several replicas collecting at once share the work
instead of removing (and tombstoning) one row twice; a row another collector already changed
no longer matches the candidate conditions. SQLite has one writer at a time.

The conditions that keep a run retained are evaluated in the statement itself (correlated
``NOT EXISTS``), never from a list held in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, bindparam, delete, exists, insert, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import ArtifactStatus
from effect_ledger.domain.retention import (
    MARKER_KEY,
    OPEN_EFFECT_STAGES,
    OPEN_SCHEDULE_STATES,
    REACHING_CHECKPOINT_STATUSES,
    UNRESOLVED_APPROVAL_STATES,
    Kind,
    Rule,
    Tombstone,
    referenced_digests,
)
from effect_ledger.storage.schema import (
    approvals,
    artifacts,
    checkpoints,
    decisions,
    effects,
    legal_holds,
    retention_rules,
    run_events,
    schedules,
    snapshots,
    tombstones,
)

# A collected trace event's payload starts with this (canonical JSON sorts keys; the marker
# has one key). The full check is domain.retention.marker_of.
_MARKER_PREFIX = '{"' + MARKER_KEY + '":'


# --- rules ---------------------------------------------------------------------------------


def _rule(row: Row[Any]) -> Rule:
    return Rule(Kind(row.kind), row.max_age_seconds, row.updated_by, row.updated_at)


async def rules(connection: AsyncConnection, tenant_id: str) -> list[Rule]:
    rows = await connection.execute(
        select(retention_rules).where(retention_rules.c.tenant_id == tenant_id).order_by(retention_rules.c.kind)
    )
    return [_rule(row) for row in rows]


async def put_rule(connection: AsyncConnection, tenant_id: str, rule: Rule) -> None:
    """Insert or replace the tenant's rule for ``rule.kind`` (delete then insert: one row)."""
    await remove_rule(connection, tenant_id, rule.kind)
    await connection.execute(
        insert(retention_rules).values(
            tenant_id=tenant_id,
            kind=rule.kind.value,
            max_age_seconds=rule.max_age_seconds,
            updated_by=rule.updated_by,
            updated_at=rule.updated_at,
        )
    )


async def remove_rule(connection: AsyncConnection, tenant_id: str, kind: Kind) -> None:
    await connection.execute(
        delete(retention_rules).where(retention_rules.c.tenant_id == tenant_id, retention_rules.c.kind == kind.value)
    )


# --- legal holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldRecord:
    run_id: str
    reason: str
    placed_by: str
    placed_at: datetime
    released_by: str | None
    released_at: datetime | None


def _hold(row: Row[Any]) -> HoldRecord:
    return HoldRecord(row.run_id, row.reason, row.placed_by, row.placed_at, row.released_by, row.released_at)


async def get_hold(
    connection: AsyncConnection, tenant_id: str, run_id: str, *, lock: bool = False
) -> HoldRecord | None:
    query = select(legal_holds).where(legal_holds.c.tenant_id == tenant_id, legal_holds.c.run_id == run_id)
    if lock:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    return _hold(row) if row is not None else None


async def place_hold(
    connection: AsyncConnection, tenant_id: str, run_id: str, reason: str, placed_by: str, now: datetime, *, new: bool
) -> None:
    values = {"reason": reason, "placed_by": placed_by, "placed_at": now, "released_by": None, "released_at": None}
    if new:
        await connection.execute(insert(legal_holds).values(tenant_id=tenant_id, run_id=run_id, **values))
    else:
        await connection.execute(
            update(legal_holds)
            .where(legal_holds.c.tenant_id == tenant_id, legal_holds.c.run_id == run_id)
            .values(**values)
        )


async def release_hold(connection: AsyncConnection, tenant_id: str, run_id: str, by: str, now: datetime) -> None:
    await connection.execute(
        update(legal_holds)
        .where(legal_holds.c.tenant_id == tenant_id, legal_holds.c.run_id == run_id)
        .values(released_by=by, released_at=now)
    )


async def holds_page(
    connection: AsyncConnection, tenant_id: str, after_run_id: str, limit: int, *, include_released: bool
) -> list[HoldRecord]:
    query = select(legal_holds).where(legal_holds.c.tenant_id == tenant_id, legal_holds.c.run_id > after_run_id)
    if not include_released:
        query = query.where(legal_holds.c.released_at.is_(None))
    rows = await connection.execute(query.order_by(legal_holds.c.run_id).limit(limit))
    return [_hold(row) for row in rows]


# --- tombstones ----------------------------------------------------------------------------


def _tombstone(row: Row[Any]) -> Tombstone:
    return Tombstone(
        tombstone_id=row.tombstone_id,
        kind=Kind(row.kind),
        subject=row.subject,
        run_id=row.run_id or "",
        material_digest=row.material_digest,
        event_hash=row.event_hash or "",
        rule_max_age_seconds=row.rule_max_age_seconds,
        removed_at=row.removed_at,
        removed_by=row.removed_by,
    )


async def latest_tombstone(connection: AsyncConnection, tenant_id: str, kind: Kind, subject: str) -> Tombstone | None:
    """The newest tombstone of ``subject`` (an artifact put again and collected again has two)."""
    row = (
        await connection.execute(
            select(tombstones)
            .where(
                tombstones.c.tenant_id == tenant_id, tombstones.c.kind == kind.value, tombstones.c.subject == subject
            )
            .order_by(tombstones.c.removed_at.desc(), tombstones.c.tombstone_id.desc())
            .limit(1)
        )
    ).first()
    return _tombstone(row) if row is not None else None


async def tombstones_by_id(connection: AsyncConnection, tenant_id: str, ids: list[str]) -> dict[str, Tombstone]:
    if not ids:
        return {}
    rows = await connection.execute(
        select(tombstones).where(tombstones.c.tenant_id == tenant_id, tombstones.c.tombstone_id.in_(sorted(set(ids))))
    )
    return {row.tombstone_id: _tombstone(row) for row in rows}


def tombstones_of_run_sync(connection: Any, tenant_id: str, run_id: str) -> dict[str, Tombstone]:
    """A run's trace tombstones, by id (``effect-ledger verify``, a synchronous connection)."""
    rows = connection.execute(
        select(tombstones).where(
            tombstones.c.tenant_id == tenant_id, tombstones.c.run_id == run_id, tombstones.c.kind == Kind.TRACE.value
        )
    )
    return {row.tombstone_id: _tombstone(row) for row in rows}


async def insert_tombstones(connection: AsyncConnection, tenant_id: str, written: list[Tombstone]) -> None:
    if not written:
        return
    await connection.execute(
        insert(tombstones),
        [
            {
                "tenant_id": tenant_id,
                "tombstone_id": t.tombstone_id,
                "kind": t.kind.value,
                "subject": t.subject,
                "run_id": t.run_id or None,
                "material_digest": t.material_digest,
                "event_hash": t.event_hash or None,
                "rule_max_age_seconds": t.rule_max_age_seconds,
                "removed_at": t.removed_at,
                "removed_by": t.removed_by,
            }
            for t in written
        ],
    )


# --- what keeps a run retained ---------------------------------------------------------------


def not_retained(tenant_column: Any, run_column: Any, now: datetime) -> Any:
    """True for a run with no legal hold, no open effect, no open schedule and no unresolved
    approval (domain.retention.retained_because, as SQL correlated to the outer row)."""
    held = exists().where(
        legal_holds.c.tenant_id == tenant_column,
        legal_holds.c.run_id == run_column,
        legal_holds.c.released_at.is_(None),
    )
    open_effect = exists().where(
        effects.c.tenant_id == tenant_column,
        effects.c.run_id == run_column,
        effects.c.stage.in_(OPEN_EFFECT_STAGES),
    )
    open_schedule = exists().where(
        schedules.c.tenant_id == tenant_column,
        schedules.c.run_id == run_column,
        schedules.c.state.in_(OPEN_SCHEDULE_STATES),
    )
    unresolved_approval = exists().where(
        approvals.c.tenant_id == tenant_column,
        approvals.c.run_id == run_column,
        approvals.c.state.in_(UNRESOLVED_APPROVAL_STATES),
        approvals.c.expires_at > now,
    )
    return and_(not_(held), not_(open_effect), not_(open_schedule), not_(unresolved_approval))


# --- candidates, one batch each ------------------------------------------------------------


def _lock(query: Any, dry_run: bool) -> Any:
    return query if dry_run else query.with_for_update(skip_locked=True)


async def decision_batch(
    connection: AsyncConnection,
    tenant_id: str,
    cutoff: datetime,
    now: datetime,
    after_id: str,
    limit: int,
    *,
    dry_run: bool,
) -> list[Row[Any]]:
    """Decisions older than ``cutoff`` of runs not retained, in id order (ids begin with their
    creation time, so old decisions come first); never their policy input (it is not read)."""
    columns = (decisions.c.decision_id, decisions.c.run_id, decisions.c.input_digest)
    return await _aged_batch(connection, decisions, columns, tenant_id, cutoff, now, after_id, limit, dry_run)


async def _aged_batch(
    connection: AsyncConnection,
    table: Any,
    columns: tuple[Any, ...],
    tenant_id: str,
    cutoff: datetime,
    now: datetime,
    after_id: str,
    limit: int,
    dry_run: bool,
) -> list[Row[Any]]:
    """Rows of ``table`` created before ``cutoff`` by runs not retained, after ``after_id`` in
    the order of their first column (the table's id, which begins with its creation time)."""
    identifier = columns[0]
    query = (
        select(*columns)
        .where(
            table.c.tenant_id == tenant_id,
            identifier > after_id,
            table.c.created_at < cutoff,
            not_retained(table.c.tenant_id, table.c.run_id, now),
        )
        .order_by(identifier)
        .limit(limit)
    )
    return list((await connection.execute(_lock(query, dry_run))).all())


async def _delete(connection: AsyncConnection, table: Any, identifier: Any, tenant_id: str, ids: list[str]) -> None:
    await connection.execute(delete(table).where(table.c.tenant_id == tenant_id, identifier.in_(ids)))


async def delete_decisions(connection: AsyncConnection, tenant_id: str, ids: list[str]) -> None:
    await _delete(connection, decisions, decisions.c.decision_id, tenant_id, ids)


async def event_batch(
    connection: AsyncConnection,
    tenant_id: str,
    cutoff: datetime,
    now: datetime,
    after: tuple[str, int],
    limit: int,
    *,
    dry_run: bool,
) -> list[Row[Any]]:
    """Trace events older than ``cutoff`` of runs not retained, whose payload is not yet a
    marker, in (run, revision) order."""
    after_run, after_revision = after
    query = (
        select(run_events.c.run_id, run_events.c.revision, run_events.c.payload, run_events.c.hash)
        .where(
            run_events.c.tenant_id == tenant_id,
            or_(
                run_events.c.run_id > after_run,
                and_(run_events.c.run_id == after_run, run_events.c.revision > after_revision),
            ),
            run_events.c.created_at < cutoff,
            not_(run_events.c.payload.startswith(_MARKER_PREFIX, autoescape=True)),
            not_retained(run_events.c.tenant_id, run_events.c.run_id, now),
        )
        .order_by(run_events.c.run_id, run_events.c.revision)
        .limit(limit)
    )
    return list((await connection.execute(_lock(query, dry_run))).all())


async def replace_payloads(connection: AsyncConnection, tenant_id: str, replaced: list[dict[str, Any]]) -> None:
    """``replaced``: {run_id, revision, payload (canonical JSON text)} for each event."""
    if not replaced:
        return
    statement = (
        update(run_events)
        .where(
            run_events.c.tenant_id == tenant_id,
            run_events.c.run_id == bindparam("where_run_id"),
            run_events.c.revision == bindparam("where_revision"),
        )
        .values(payload=bindparam("new_payload"))
    )
    await connection.execute(
        statement,
        [{"where_run_id": r["run_id"], "where_revision": r["revision"], "new_payload": r["payload"]} for r in replaced],
    )


async def snapshot_batch(
    connection: AsyncConnection,
    tenant_id: str,
    cutoff: datetime,
    now: datetime,
    after_id: str,
    limit: int,
    *,
    dry_run: bool,
) -> list[Row[Any]]:
    columns = (snapshots.c.snapshot_id, snapshots.c.run_id, snapshots.c.value)
    return await _aged_batch(connection, snapshots, columns, tenant_id, cutoff, now, after_id, limit, dry_run)


async def delete_snapshots(connection: AsyncConnection, tenant_id: str, ids: list[str]) -> None:
    await _delete(connection, snapshots, snapshots.c.snapshot_id, tenant_id, ids)


async def reachable_artifact_digests(
    connection: AsyncConnection, tenant_id: str, now: datetime, page_rows: int
) -> set[str]:
    """Digests that SEALED or REGISTERED checkpoints of retained runs reference. Bounded by the
    tenant's artifact quota (a digest names one stored artifact); read in pages."""
    found: set[str] = set()
    after = ""
    while True:
        rows = (
            await connection.execute(
                select(checkpoints.c.checkpoint_id, checkpoints.c.artifacts)
                .where(
                    checkpoints.c.tenant_id == tenant_id,
                    checkpoints.c.checkpoint_id > after,
                    checkpoints.c.status.in_(REACHING_CHECKPOINT_STATUSES),
                    not_(not_retained(checkpoints.c.tenant_id, checkpoints.c.run_id, now)),
                )
                .order_by(checkpoints.c.checkpoint_id)
                .limit(page_rows)
            )
        ).all()
        for row in rows:
            found |= referenced_digests(row.artifacts)
        if len(rows) < page_rows:
            return found
        after = rows[-1].checkpoint_id


async def artifact_batch(
    connection: AsyncConnection, tenant_id: str, cutoff: datetime, after_digest: str, limit: int, *, dry_run: bool
) -> list[Row[Any]]:
    """Artifacts not yet collected whose content is older than ``cutoff``, in digest order."""
    query = (
        select(artifacts.c.digest)
        .where(
            artifacts.c.tenant_id == tenant_id,
            artifacts.c.digest > after_digest,
            artifacts.c.status != ArtifactStatus.TOMBSTONE.value,
            artifacts.c.updated_at < cutoff,
        )
        .order_by(artifacts.c.digest)
        .limit(limit)
    )
    return list((await connection.execute(_lock(query, dry_run))).all())


async def tombstone_artifacts(connection: AsyncConnection, tenant_id: str, digests: list[str], now: datetime) -> None:
    await connection.execute(
        update(artifacts)
        .where(artifacts.c.tenant_id == tenant_id, artifacts.c.digest.in_(digests))
        .values(status=ArtifactStatus.TOMBSTONE.value, content=None, updated_at=now)
    )


def marker_text(payload: dict[str, Any]) -> str:
    return canonical_bytes(payload).decode("utf-8")


def payload_of(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict), "event payloads are JSON objects"
    return value


async def tenants_with_rules(connection: AsyncConnection, after_tenant_id: str, limit: int) -> list[str]:
    rows = await connection.execute(
        select(retention_rules.c.tenant_id)
        .where(retention_rules.c.tenant_id > after_tenant_id)
        .group_by(retention_rules.c.tenant_id)
        .order_by(retention_rules.c.tenant_id)
        .limit(limit)
    )
    return [row.tenant_id for row in rows]
