"""The run's trace as a hash chain, appended in the transaction that changes what the events
describe. The only writer of ``run_events`` and of a run's head (revision, hash) on the general
path; PostgreSQL's fast path (``gate_store.el_apply``) appends the same way under the same lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.trace import event_hash
from effect_ledger.storage.dialect import is_postgresql
from effect_ledger.storage.schema import run_events, runs
from effect_ledger.storage.statements import prepared


def _canonical_text(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


async def append_events(
    connection: AsyncConnection,
    tenant_id: str,
    run_id: str,
    pending: Sequence[tuple[str, dict[str, Any], str]],
    now: datetime,
) -> int:
    """Append events to a run's trace in this transaction; returns the new head revision.

    The run row is locked (``FOR NO KEY UPDATE``) so revisions increase by exactly one and each
    event carries the hash of the one before it, whatever other replicas do concurrently. Not
    ``FOR UPDATE``: every row this transaction inserted with a foreign key to the run (effect,
    decision, approval) already holds ``FOR KEY SHARE`` on it, and ``FOR UPDATE`` conflicts with
    the other writers' key-share locks, so concurrent writers of one run deadlocked here.
    ``FOR NO KEY UPDATE`` still excludes every other appender.
    """
    lock_head = prepared(
        "lock_run_head",
        "",
        lambda: (
            select(runs.c.revision, runs.c.head_hash)
            .where(runs.c.tenant_id == bindparam("tenant_id"), runs.c.run_id == bindparam("run_id"))
            .with_for_update(key_share=True)
        ),
    )
    head = (await connection.execute(lock_head, {"tenant_id": tenant_id, "run_id": run_id})).one()
    revision, prev_hash = head.revision, head.head_hash
    rows: list[dict[str, Any]] = []
    for event_type, payload, principal_id in pending:
        revision += 1
        digest = event_hash(
            prev_hash=prev_hash,
            tenant_id=tenant_id,
            run_id=run_id,
            revision=revision,
            event_type=event_type,
            payload=payload,
            principal_id=principal_id,
            created_at=now,
        )
        rows.append(
            {
                "tenant_id": tenant_id,
                "run_id": run_id,
                "revision": revision,
                "type": event_type,
                "payload": _canonical_text(payload),
                "principal_id": principal_id,
                "created_at": now,
                "prev_hash": prev_hash,
                "hash": digest,
            }
        )
        prev_hash = digest
    new_head = {
        "where_tenant_id": tenant_id,
        "where_run_id": run_id,
        "new_revision": revision,
        "new_head_hash": prev_hash,
    }
    if is_postgresql(connection) and len(rows) == 1:
        # One round trip: the event and the new head in one statement (a data-modifying CTE).
        first = {f"event_{name}": value for name, value in rows[0].items()}
        await connection.execute(prepared("append_one_event", "postgresql", _append_one_event), {**new_head, **first})
    else:
        await connection.execute(prepared("insert_events", "", lambda: insert(run_events)), rows)
        await connection.execute(prepared("move_run_head", "", _move_run_head), new_head)
    return revision


def _move_run_head() -> Any:
    return (
        update(runs)
        .where(runs.c.tenant_id == bindparam("where_tenant_id"), runs.c.run_id == bindparam("where_run_id"))
        .values(revision=bindparam("new_revision"), head_hash=bindparam("new_head_hash"))
    )


def _append_one_event() -> Any:
    values = {column.name: bindparam(f"event_{column.name}", type_=column.type) for column in run_events.c}
    appended = insert(run_events).values(values).cte("appended")
    return _move_run_head().add_cte(appended)
