"""Checkpoint queries: records, artifacts, sibling lifetimes, resume obligations."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import ArtifactClass, ArtifactRef, ArtifactStatus, Facts
from effect_ledger.domain.model import Stage
from effect_ledger.storage.dialect import insert_ignoring_conflict
from effect_ledger.storage.schema import (
    artifacts,
    checkpoints,
    effects,
    execution_handles,
    provider_sessions,
    resume_obligations,
    runs,
    snapshots,
)
from effect_ledger.storage.statements import prepared


def _text(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


@dataclass
class CheckpointRecord:
    checkpoint_id: str
    run_id: str
    revision: int
    status: str
    format_version: int
    state: Any
    artifacts: list[ArtifactRef]
    ledger: dict[str, Any]
    manifest: dict[str, Any]
    manifest_digest: str
    facts: Facts
    policy_revision: str
    sealed_by: str
    sealed_at: datetime
    registered_by: str | None = None
    registered_at: datetime | None = None
    derived_from: str | None = None
    imported_from_digest: str | None = None


def _record(row: Row[Any]) -> CheckpointRecord:
    return CheckpointRecord(
        checkpoint_id=row.checkpoint_id,
        run_id=row.run_id,
        revision=row.revision,
        status=row.status,
        format_version=row.format_version,
        state=json.loads(row.state),
        artifacts=[
            ArtifactRef(a["name"], a["digest"], ArtifactClass(a["classification"])) for a in json.loads(row.artifacts)
        ],
        ledger=json.loads(row.ledger),
        manifest=json.loads(row.manifest),
        manifest_digest=row.manifest_digest,
        facts=Facts.from_json(json.loads(row.facts)),
        policy_revision=row.policy_revision,
        sealed_by=row.sealed_by,
        sealed_at=row.sealed_at,
        registered_by=row.registered_by,
        registered_at=row.registered_at,
        derived_from=row.derived_from,
        imported_from_digest=row.imported_from_digest,
    )


async def insert_checkpoint(connection: AsyncConnection, tenant_id: str, record: CheckpointRecord) -> None:
    await connection.execute(
        insert(checkpoints).values(
            tenant_id=tenant_id,
            checkpoint_id=record.checkpoint_id,
            run_id=record.run_id,
            revision=record.revision,
            status=record.status,
            format_version=record.format_version,
            state=_text(record.state),
            artifacts=_text([ref.as_json() for ref in record.artifacts]),
            ledger=_text(record.ledger),
            manifest=_text(record.manifest),
            manifest_digest=record.manifest_digest,
            facts=_text(record.facts.as_json()),
            policy_revision=record.policy_revision,
            sealed_by=record.sealed_by,
            sealed_at=record.sealed_at,
            registered_by=record.registered_by,
            registered_at=record.registered_at,
            derived_from=record.derived_from,
            imported_from_digest=record.imported_from_digest,
        )
    )


async def get_checkpoint(
    connection: AsyncConnection, tenant_id: str, checkpoint_id: str, *, lock: bool
) -> CheckpointRecord | None:
    query = select(checkpoints).where(
        checkpoints.c.tenant_id == tenant_id, checkpoints.c.checkpoint_id == checkpoint_id
    )
    if lock:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    return _record(row) if row is not None else None


async def list_checkpoints(
    connection: AsyncConnection, tenant_id: str, run_id: str, after_id: str, limit: int
) -> list[CheckpointRecord]:
    rows = (
        await connection.execute(
            select(checkpoints)
            .where(
                checkpoints.c.tenant_id == tenant_id,
                checkpoints.c.run_id == run_id,
                checkpoints.c.checkpoint_id > after_id,
            )
            .order_by(checkpoints.c.checkpoint_id)
            .limit(limit)
        )
    ).all()
    return [_record(row) for row in rows]


async def register(
    connection: AsyncConnection, tenant_id: str, checkpoint_id: str, facts: Facts, principal_id: str, now: datetime
) -> None:
    await connection.execute(
        update(checkpoints)
        .where(checkpoints.c.tenant_id == tenant_id, checkpoints.c.checkpoint_id == checkpoint_id)
        .values(status="REGISTERED", facts=_text(facts.as_json()), registered_by=principal_id, registered_at=now)
    )


async def lock_run_head(connection: AsyncConnection, tenant_id: str, run_id: str) -> Row[Any] | None:
    """The run row, locked: no event can be appended to its trace until this transaction ends."""
    return (
        await connection.execute(
            select(runs).where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id).with_for_update()
        )
    ).first()


async def set_configuration(
    connection: AsyncConnection, tenant_id: str, run_id: str, segment: int, configuration: tuple[str, str, str]
) -> None:
    await connection.execute(
        update(runs)
        .where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id)
        .values(segment=segment, provider=configuration[0], model=configuration[1], adapter=configuration[2])
    )


# --- artifacts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ArtifactRow:
    digest: str
    size_bytes: int
    media_type: str
    status: ArtifactStatus
    location: str
    created_at: datetime
    updated_at: datetime


def _artifact(row: Row[Any]) -> ArtifactRow:
    return ArtifactRow(
        row.digest,
        row.size_bytes,
        row.media_type,
        ArtifactStatus(row.status),
        row.location,
        row.created_at,
        row.updated_at,
    )


async def get_artifact(
    connection: AsyncConnection, tenant_id: str, digest: str, *, lock: bool = False
) -> ArtifactRow | None:
    query = select(*[c for c in artifacts.c if c.name != "content"]).where(
        artifacts.c.tenant_id == tenant_id, artifacts.c.digest == digest
    )
    if lock:
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    return _artifact(row) if row is not None else None


async def artifact_statuses(
    connection: AsyncConnection, tenant_id: str, digests: list[str]
) -> dict[str, ArtifactStatus]:
    if not digests:
        return {}
    rows = (
        await connection.execute(
            select(artifacts.c.digest, artifacts.c.status).where(
                artifacts.c.tenant_id == tenant_id, artifacts.c.digest.in_(sorted(set(digests)))
            )
        )
    ).all()
    return {row.digest: ArtifactStatus(row.status) for row in rows}


async def put_artifact(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    digest: str,
    size_bytes: int,
    media_type: str,
    status: ArtifactStatus,
    location: str,
    content: bytes | None,
    now: datetime,
) -> None:
    statement = (
        insert_ignoring_conflict(connection, artifacts)
        .values(
            tenant_id=tenant_id,
            digest=digest,
            size_bytes=size_bytes,
            media_type=media_type,
            status=status.value,
            location=location,
            content=content,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "digest"])
    )
    await connection.execute(statement)


async def set_artifact(connection: AsyncConnection, tenant_id: str, digest: str, now: datetime, **values: Any) -> None:
    await connection.execute(
        update(artifacts)
        .where(artifacts.c.tenant_id == tenant_id, artifacts.c.digest == digest)
        .values(updated_at=now, **values)
    )


# --- sibling lifetimes ---------------------------------------------------------------------


async def stored_artifacts(connection: AsyncConnection, tenant_id: str, up_to: int) -> int:
    """The tenant's artifacts that are not deleted, counted up to ``up_to`` (a quota check)."""
    kept = (
        select(artifacts.c.digest)
        .where(artifacts.c.tenant_id == tenant_id, artifacts.c.status != ArtifactStatus.TOMBSTONE.value)
        .limit(up_to)
        .subquery()
    )
    return int((await connection.execute(select(func.count()).select_from(kept))).scalar_one())


async def recorded_snapshots(connection: AsyncConnection, tenant_id: str, up_to: int) -> int:
    """The tenant's snapshots, counted up to ``up_to`` (a quota check)."""
    kept = select(snapshots.c.snapshot_id).where(snapshots.c.tenant_id == tenant_id).limit(up_to).subquery()
    return int((await connection.execute(select(func.count()).select_from(kept))).scalar_one())


async def insert_snapshot(connection: AsyncConnection, tenant_id: str, **values: Any) -> None:
    values["value"] = _text(values["value"])
    await connection.execute(insert(snapshots).values(tenant_id=tenant_id, **values))


async def insert_provider_session(connection: AsyncConnection, tenant_id: str, **values: Any) -> None:
    await connection.execute(insert(provider_sessions).values(tenant_id=tenant_id, **values))


async def insert_execution_handle(connection: AsyncConnection, tenant_id: str, **values: Any) -> None:
    await connection.execute(insert(execution_handles).values(tenant_id=tenant_id, **values))


# --- resume obligations --------------------------------------------------------------------

OPEN = [Stage.AUTHORIZED.value, Stage.DISPATCHED.value, Stage.UNKNOWN.value]


async def add_obligations(
    connection: AsyncConnection, tenant_id: str, run_id: str, effect_ids: list[str], checkpoint_id: str, now: datetime
) -> None:
    for effect_id in effect_ids:
        await connection.execute(
            insert_ignoring_conflict(connection, resume_obligations)
            .values(
                tenant_id=tenant_id, run_id=run_id, effect_id=effect_id, checkpoint_id=checkpoint_id, created_at=now
            )
            .on_conflict_do_nothing(index_elements=["tenant_id", "run_id", "effect_id"])
        )


async def outstanding_obligations(
    connection: AsyncConnection, tenant_id: str, run_id: str, limit: int = 50
) -> list[str]:
    """Effects open at a resume of this run that are still open now."""
    query = prepared(
        "outstanding_obligations",
        "",
        lambda: (
            select(resume_obligations.c.effect_id)
            .select_from(
                resume_obligations.join(
                    effects,
                    and_(
                        effects.c.tenant_id == resume_obligations.c.tenant_id,
                        effects.c.effect_id == resume_obligations.c.effect_id,
                    ),
                )
            )
            .where(
                resume_obligations.c.tenant_id == bindparam("tenant_id"),
                resume_obligations.c.run_id == bindparam("run_id"),
                effects.c.stage.in_(OPEN),
            )
            .order_by(resume_obligations.c.effect_id)
            .limit(bindparam("limit"))
        ),
    )
    rows = (await connection.execute(query, {"tenant_id": tenant_id, "run_id": run_id, "limit": limit})).all()
    return [row.effect_id for row in rows]


async def ancestor_effect(
    connection: AsyncConnection,
    tenant_id: str,
    run_ids: list[str],
    tool: str,
    target: str,
    digest_at: Callable[[int], str],
) -> Any:
    """An effect of this intent in one of the given (ancestor) runs: settled ones first.

    Each candidate is compared under the tool revision it is pinned to (``digest_at(revision)``
    is the request's digest under that revision), as a retry of its key would be: a contract
    update after the ancestor's effect must not hide it from a fork.
    """
    if not run_ids:
        return None
    rows = (
        await connection.execute(
            select(
                effects.c.effect_id, effects.c.stage, effects.c.run_id, effects.c.tool_revision, effects.c.intent_digest
            ).where(
                effects.c.tenant_id == tenant_id,
                effects.c.run_id.in_(run_ids),
                effects.c.tool == tool,
                effects.c.target == target,
            )
        )
    ).all()
    digests = {revision: digest_at(revision) for revision in {row.tool_revision for row in rows}}
    matching = [row for row in rows if row.intent_digest == digests[row.tool_revision]]
    order = {Stage.SUCCEEDED.value: 0, Stage.UNKNOWN.value: 1, Stage.DISPATCHED.value: 2, Stage.AUTHORIZED.value: 3}
    ranked = sorted((row for row in matching if row.stage in order), key=lambda row: order[row.stage])
    return ranked[0] if ranked else None
