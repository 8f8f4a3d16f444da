"""Queries. Rows in, domain values out; every query is scoped to one tenant.

Locking order, kept by every writer so that two transactions never wait on each other in a
cycle: an effect row (``FOR UPDATE``) first, the run row (when its trace is appended) last.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, literal, select, union_all, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.model import (
    Attempt,
    Decision,
    Effect,
    EffectClass,
    FailureEvidence,
    Outcome,
    Principal,
    Reason,
    Receipt,
    Recovery,
    Role,
    Run,
    RunEvent,
    Stage,
    ToolContract,
)
from effect_ledger.storage.dialect import clock_expression, clock_value, insert_ignoring_conflict
from effect_ledger.storage.schema import (
    attempts,
    decisions,
    effects,
    principals,
    run_events,
    runs,
    tool_contracts,
)
from effect_ledger.storage.statements import prepared


def new_id(prefix: str) -> str:
    """Time-ordered, unguessable: 16 hex digits of nanoseconds, then 16 random hex digits."""
    return f"{prefix}_{time.time_ns():016x}{os.urandom(8).hex()}"


def _canonical_text(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


# --- principals ----------------------------------------------------------------------------


async def authenticate(connection: AsyncConnection, token_hash: str) -> tuple[Principal | None, datetime | None]:
    """The principal holding the token, read under current facts (roles as they are now; not
    disabled; the token not past its expiry), and the database clock, in one round trip."""
    dialect = connection.dialect.name
    query = prepared(
        "authenticate",
        dialect,
        lambda: select(
            principals.c.tenant_id,
            principals.c.principal_id,
            principals.c.roles,
            principals.c.token_expires_at,
            principals.c.client_subject,
            clock_expression(dialect),
        ).where(principals.c.token_hash == bindparam("token_hash"), principals.c.disabled_at.is_(None)),
    )
    row = (await connection.execute(query, {"token_hash": token_hash})).first()
    if row is None:
        return None, None
    now = clock_value(row.database_now)
    if row.token_expires_at is not None and row.token_expires_at <= now:
        return None, None  # the token expired: judged by the database's clock
    principal = Principal(
        row.tenant_id, row.principal_id, frozenset(Role(r) for r in json.loads(row.roles)), row.client_subject
    )
    return principal, now


# --- tool contracts ------------------------------------------------------------------------


def _contract(row: Row[Any]) -> ToolContract:
    schema_text = row.arguments_schema
    return ToolContract(
        tool=row.tool,
        revision=row.revision,
        effect_class=EffectClass(row.effect_class),
        provider_idempotency=row.provider_idempotency,
        queryable=row.queryable,
        allowed_recovery=tuple(Recovery(r) for r in json.loads(row.allowed_recovery)),
        arguments_schema=json.loads(schema_text) if schema_text is not None else None,
        max_attempts=row.max_attempts,
        lease_seconds=row.lease_seconds,
        retired=row.retired,
        retired_reason=row.retired_reason,
        created_at=row.created_at,
        created_by=row.created_by,
        default_estimate=json.loads(row.default_estimate),
        simulator=row.simulator,
    )


async def latest_contract(connection: AsyncConnection, tenant_id: str, tool: str) -> ToolContract | None:
    query = prepared(
        "latest_contract",
        "",
        lambda: (
            select(tool_contracts)
            .where(tool_contracts.c.tenant_id == bindparam("tenant_id"), tool_contracts.c.tool == bindparam("tool"))
            .order_by(tool_contracts.c.revision.desc())
            .limit(1)
        ),
    )
    row = (await connection.execute(query, {"tenant_id": tenant_id, "tool": tool})).first()
    return _contract(row) if row is not None else None


async def contract_revision(
    connection: AsyncConnection, tenant_id: str, tool: str, revision: int
) -> ToolContract | None:
    query = prepared(
        "contract_revision",
        "",
        lambda: select(tool_contracts).where(
            tool_contracts.c.tenant_id == bindparam("tenant_id"),
            tool_contracts.c.tool == bindparam("tool"),
            tool_contracts.c.revision == bindparam("revision"),
        ),
    )
    row = (await connection.execute(query, {"tenant_id": tenant_id, "tool": tool, "revision": revision})).first()
    return _contract(row) if row is not None else None


async def insert_contract(connection: AsyncConnection, tenant_id: str, contract: ToolContract) -> None:
    """Insert a revision. Two admins racing for one revision: the primary key lets one win."""
    await connection.execute(
        insert(tool_contracts).values(
            tenant_id=tenant_id,
            tool=contract.tool,
            revision=contract.revision,
            effect_class=contract.effect_class.value,
            provider_idempotency=contract.provider_idempotency,
            queryable=contract.queryable,
            allowed_recovery=_canonical_text([r.value for r in contract.allowed_recovery]),
            arguments_schema=(
                _canonical_text(contract.arguments_schema) if contract.arguments_schema is not None else None
            ),
            max_attempts=contract.max_attempts,
            lease_seconds=contract.lease_seconds,
            retired=contract.retired,
            retired_reason=contract.retired_reason,
            created_at=contract.created_at,
            created_by=contract.created_by,
            default_estimate=_canonical_text(contract.default_estimate),
            simulator=contract.simulator,
        )
    )


async def list_latest_contracts(
    connection: AsyncConnection, tenant_id: str, after_tool: str, limit: int, include_retired: bool
) -> list[ToolContract]:
    latest = (
        select(tool_contracts.c.tool, func.max(tool_contracts.c.revision).label("revision"))
        .where(tool_contracts.c.tenant_id == tenant_id, tool_contracts.c.tool > after_tool)
        .group_by(tool_contracts.c.tool)
        .subquery()
    )
    query = (
        select(tool_contracts)
        .join(
            latest,
            and_(tool_contracts.c.tool == latest.c.tool, tool_contracts.c.revision == latest.c.revision),
        )
        .where(tool_contracts.c.tenant_id == tenant_id)
        .order_by(tool_contracts.c.tool)
        .limit(limit)
    )
    if not include_retired:
        query = query.where(tool_contracts.c.retired.is_(False))
    return [_contract(row) for row in (await connection.execute(query)).all()]


# --- runs and their traces -----------------------------------------------------------------


def _run(row: Row[Any]) -> Run:
    return Run(
        tenant_id=row.tenant_id,
        run_id=row.run_id,
        created_by=row.created_by,
        created_at=row.created_at,
        revision=row.revision,
        head_hash=row.head_hash,
        labels=json.loads(row.labels),
        root_run_id=row.root_run_id,
        parent_run_id=row.parent_run_id,
        world=row.world,
        forked_from_checkpoint=row.forked_from_checkpoint,
        segment=row.segment,
        provider=row.provider,
        model=row.model,
        adapter=row.adapter,
    )


async def insert_run(
    connection: AsyncConnection,
    *,
    tenant_id: str,
    run_id: str,
    created_by: str,
    now: datetime,
    labels: dict[str, str],
    request_id: str | None,
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    world: str = "LIVE",
    forked_from_checkpoint: str | None = None,
    configuration: tuple[str, str, str] = ("", "", ""),
) -> None:
    await connection.execute(
        insert(runs).values(
            parent_run_id=parent_run_id,
            root_run_id=root_run_id or run_id,
            world=world,
            forked_from_checkpoint=forked_from_checkpoint,
            segment=1,
            provider=configuration[0],
            model=configuration[1],
            adapter=configuration[2],
            tenant_id=tenant_id,
            run_id=run_id,
            created_by=created_by,
            created_at=now,
            revision=0,
            head_hash="",
            labels=_canonical_text(labels),
            create_request_id=request_id,
        )
    )


async def get_run(connection: AsyncConnection, tenant_id: str, run_id: str) -> Run | None:
    query = prepared(
        "get_run",
        "",
        lambda: select(runs).where(runs.c.tenant_id == bindparam("tenant_id"), runs.c.run_id == bindparam("run_id")),
    )
    row = (await connection.execute(query, {"tenant_id": tenant_id, "run_id": run_id})).first()
    return _run(row) if row is not None else None


async def run_by_request(connection: AsyncConnection, tenant_id: str, request_id: str) -> Run | None:
    row = (
        await connection.execute(
            select(runs).where(runs.c.tenant_id == tenant_id, runs.c.create_request_id == request_id)
        )
    ).first()
    return _run(row) if row is not None else None


def _event(row: Row[Any]) -> RunEvent:
    return RunEvent(
        run_id=row.run_id,
        revision=row.revision,
        type=row.type,
        payload=json.loads(row.payload),
        principal_id=row.principal_id,
        created_at=row.created_at,
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


async def list_events(
    connection: AsyncConnection, tenant_id: str, run_id: str, after_revision: int, limit: int
) -> list[RunEvent]:
    rows = (
        await connection.execute(
            select(run_events)
            .where(
                run_events.c.tenant_id == tenant_id,
                run_events.c.run_id == run_id,
                run_events.c.revision > after_revision,
            )
            .order_by(run_events.c.revision)
            .limit(limit)
        )
    ).all()
    return [_event(row) for row in rows]


# --- effects and attempts ------------------------------------------------------------------

_ATTEMPT_COLUMNS = [c.label(f"a_{c.name}") for c in attempts.c if c.name != "tenant_id"]


def _attempt_from_prefixed(row: Row[Any]) -> Attempt | None:
    values = row._mapping
    if values["a_attempt_id"] is None:
        return None
    receipt = None
    if values["a_receipt_digest"] is not None:
        receipt = Receipt(
            provider_reference=values["a_receipt_reference"],
            detail=json.loads(values["a_receipt_detail"]),
            digest=values["a_receipt_digest"],
            recorded_at=values["a_receipt_recorded_at"],
        )
    evidence = values["a_failure_evidence"]
    return Attempt(
        attempt_id=values["a_attempt_id"],
        effect_id=values["a_effect_id"],
        number=values["a_number"],
        stage=Stage(values["a_stage"]),
        provider_key=values["a_provider_key"],
        provider_key_reused=values["a_provider_key_reused"],
        lease_expires_at=values["a_lease_expires_at"],
        authorized_at=values["a_authorized_at"],
        decision_id=values["a_decision_id"],
        dispatched_at=values["a_dispatched_at"],
        finished_at=values["a_finished_at"],
        outcome_reason=values["a_outcome_reason"],
        failure_evidence=FailureEvidence(evidence) if evidence else None,
        receipt=receipt,
        approval_id=values["a_approval_id"] or "",
        principal_id=values["a_principal_id"],
    )


def _effect(row: Row[Any]) -> Effect:
    return Effect(
        effect_id=row.effect_id,
        run_id=row.run_id,
        tool=row.tool,
        tool_revision=row.tool_revision,
        target=row.target,
        idempotency_key=row.idempotency_key,
        intent_digest=row.intent_digest,
        arguments=json.loads(row.arguments),
        stage=Stage(row.stage),
        created_at=row.created_at,
        updated_at=row.updated_at,
        reconciled_by=row.reconciled_by,
        reconcile_reason=row.reconcile_reason,
    )


def _effects_with_attempts() -> Any:
    return select(effects, *_ATTEMPT_COLUMNS).select_from(
        effects.outerjoin(
            attempts,
            and_(attempts.c.tenant_id == effects.c.tenant_id, attempts.c.effect_id == effects.c.effect_id),
        )
    )


def _assemble(rows: Sequence[Row[Any]]) -> list[Effect]:
    found: dict[str, Effect] = {}
    for row in rows:
        effect = found.get(row.effect_id)
        if effect is None:
            effect = found[row.effect_id] = _effect(row)
        attempt = _attempt_from_prefixed(row)
        if attempt is not None:
            effect.attempts.append(attempt)
    return list(found.values())


async def _effects_by_ids(connection: AsyncConnection, tenant_id: str, ids: Sequence[str]) -> list[Effect]:
    query = prepared(
        "effects_by_ids",
        "",
        lambda: (
            _effects_with_attempts()
            .where(
                effects.c.tenant_id == bindparam("tenant_id"), effects.c.effect_id.in_(bindparam("ids", expanding=True))
            )
            .order_by(effects.c.effect_id, attempts.c.number)
        ),
    )
    return _assemble((await connection.execute(query, {"tenant_id": tenant_id, "ids": list(ids)})).all())


async def _load_effects(connection: AsyncConnection, where: Any) -> list[Effect]:
    """Effects with their attempts (for less frequent, dynamic filters)."""
    query = _effects_with_attempts().where(where).order_by(effects.c.effect_id, attempts.c.number)
    return _assemble((await connection.execute(query)).all())


async def _lock_effect(connection: AsyncConnection, name: str, column: Any, tenant_id: str, value: str) -> str | None:
    """Lock an effect row FOR UPDATE by a statement of its own, before reading it.

    Under READ COMMITTED a statement that waited for a row lock re-reads only the locked row
    when the holder commits, not the rows joined to it: a join ``FOR UPDATE OF effects`` returned
    the new effect row with the attempts as they were before the holder's commit (a DUPLICATE
    without its receipt, a report applied to a stale attempt and overwriting a newer stage). The
    read that follows the lock sees everything the previous holder committed, and reads only the
    row that was locked (a row committed between the two statements is not locked).
    """
    query = prepared(
        name,
        "",
        lambda: (
            select(effects.c.effect_id)
            .where(effects.c.tenant_id == bindparam("tenant_id"), column == bindparam("value"))
            .with_for_update()
        ),
    )
    return (await connection.execute(query, {"tenant_id": tenant_id, "value": value})).scalar_one_or_none()


@dataclass(frozen=True)
class LockedEffect:
    """An effect read after its row was locked, with the database clock read in that same read:
    every lease judgment about it in this transaction uses ``now``, a time no earlier than the
    moment the lock was granted."""

    effect: Effect
    now: datetime


async def _read_locked(connection: AsyncConnection, tenant_id: str, effect_id: str) -> LockedEffect | None:
    dialect = connection.dialect.name
    query = prepared(
        "locked_effect_with_clock",
        dialect,
        lambda: (
            _effects_with_attempts()
            .add_columns(clock_expression(dialect))
            .where(effects.c.tenant_id == bindparam("tenant_id"), effects.c.effect_id == bindparam("effect_id"))
            .order_by(attempts.c.number)
        ),
    )
    rows = (await connection.execute(query, {"tenant_id": tenant_id, "effect_id": effect_id})).all()
    found = _assemble(rows)
    if not found:
        return None
    return LockedEffect(found[0], clock_value(rows[0].database_now))


async def lock_effect_by_key(connection: AsyncConnection, tenant_id: str, idempotency_key: str) -> LockedEffect | None:
    """The effect bound to a key, locked ``FOR UPDATE``, and the clock read after the lock."""
    effect_id = await _lock_effect(
        connection, "lock_effect_by_key", effects.c.idempotency_key, tenant_id, idempotency_key
    )
    if effect_id is None:
        return None  # a new idempotency key costs one round trip
    return await _read_locked(connection, tenant_id, effect_id)


async def lock_effect_by_id(connection: AsyncConnection, tenant_id: str, effect_id: str) -> LockedEffect | None:
    """The effect, locked ``FOR UPDATE``, and the clock read after the lock."""
    if await _lock_effect(connection, "lock_effect_by_id", effects.c.effect_id, tenant_id, effect_id) is None:
        return None
    return await _read_locked(connection, tenant_id, effect_id)


async def effect_by_id(connection: AsyncConnection, tenant_id: str, effect_id: str) -> Effect | None:
    """The effect as last committed, without a lock (for reads)."""
    found = await _effects_by_ids(connection, tenant_id, [effect_id])
    return found[0] if found else None


async def effect_by_key(connection: AsyncConnection, tenant_id: str, idempotency_key: str) -> Effect | None:
    """The effect bound to a key as last committed, without a lock (for reads)."""
    effect_id = (
        await connection.execute(
            select(effects.c.effect_id).where(
                effects.c.tenant_id == tenant_id, effects.c.idempotency_key == idempotency_key
            )
        )
    ).scalar_one_or_none()
    return await effect_by_id(connection, tenant_id, effect_id) if effect_id is not None else None


async def run_effects(connection: AsyncConnection, tenant_id: str, run_id: str, limit: int) -> list[Effect]:
    """A run's effects with their attempts (the first ``limit`` by id)."""
    ids = (
        select(effects.c.effect_id)
        .where(effects.c.tenant_id == tenant_id, effects.c.run_id == run_id)
        .order_by(effects.c.effect_id)
        .limit(limit)
        .scalar_subquery()
    )
    return await _load_effects(connection, and_(effects.c.tenant_id == tenant_id, effects.c.effect_id.in_(ids)))


async def effect_id_of_attempt(connection: AsyncConnection, tenant_id: str, attempt_id: str) -> str | None:
    query = prepared(
        "effect_id_of_attempt",
        "",
        lambda: select(attempts.c.effect_id).where(
            attempts.c.tenant_id == bindparam("tenant_id"), attempts.c.attempt_id == bindparam("attempt_id")
        ),
    )
    return (await connection.execute(query, {"tenant_id": tenant_id, "attempt_id": attempt_id})).scalar_one_or_none()


OPEN_STAGE_VALUES = [Stage.AUTHORIZED.value, Stage.DISPATCHED.value, Stage.UNKNOWN.value]


async def open_effects_of_run(
    connection: AsyncConnection, tenant_id: str, run_id: str, after_effect_id: str, limit: int
) -> list[Effect]:
    ids = (
        select(effects.c.effect_id)
        .where(
            effects.c.tenant_id == tenant_id,
            effects.c.run_id == run_id,
            effects.c.stage.in_(OPEN_STAGE_VALUES),
            effects.c.effect_id > after_effect_id,
        )
        .order_by(effects.c.effect_id)
        .limit(limit)
        .scalar_subquery()
    )
    return await _load_effects(connection, and_(effects.c.tenant_id == tenant_id, effects.c.effect_id.in_(ids)))


def _effects_for_policy_statement() -> Any:
    columns = [
        effects.c.effect_id,
        effects.c.run_id,
        effects.c.tool,
        effects.c.target,
        effects.c.stage,
        effects.c.idempotency_key,
    ]
    run_open = (
        select(*columns, literal("run").label("kind"))
        .where(
            effects.c.tenant_id == bindparam("tenant_id"),
            effects.c.run_id == bindparam("run_id"),
            effects.c.stage.in_(OPEN_STAGE_VALUES),
        )
        .order_by(effects.c.effect_id)
        .limit(bindparam("open_limit"))
        .subquery()
    )
    on_target = (
        select(*columns, literal("target").label("kind"))
        .where(
            effects.c.tenant_id == bindparam("tenant_id"),
            effects.c.tool == bindparam("tool"),
            effects.c.target == bindparam("target"),
            effects.c.stage == Stage.UNKNOWN.value,
        )
        .order_by(effects.c.effect_id)
        .limit(bindparam("unknown_limit"))
        .subquery()
    )
    return union_all(select(run_open), select(on_target))


async def effects_for_policy(
    connection: AsyncConnection,
    tenant_id: str,
    run_id: str,
    tool: str,
    target: str,
    open_limit: int,
    unknown_limit: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """In one round trip: a bounded summary of the run's open effects, and the UNKNOWN effects
    of the same tool on the same target (any run of the tenant)."""
    query = prepared("effects_for_policy", "", _effects_for_policy_statement)
    parameters = {
        "tenant_id": tenant_id,
        "run_id": run_id,
        "tool": tool,
        "target": target,
        "open_limit": open_limit,
        "unknown_limit": unknown_limit,
    }
    rows = sorted((await connection.execute(query, parameters)).all(), key=lambda r: r.effect_id)
    open_summaries = [
        {"effect_id": r.effect_id, "tool": r.tool, "target": r.target, "stage": r.stage}
        for r in rows
        if r.kind == "run"
    ]
    unknown = [
        {"effect_id": r.effect_id, "run_id": r.run_id, "idempotency_key": r.idempotency_key}
        for r in rows
        if r.kind == "target"
    ]
    return open_summaries, unknown


async def insert_effect_if_absent(connection: AsyncConnection, tenant_id: str, effect: Effect) -> bool:
    """Insert the effect unless its (tenant, idempotency key) is taken; True when inserted.

    ON CONFLICT DO NOTHING waits for a concurrent inserter of the same key to finish; the
    loser sees no row returned and the unit of work is run again, now finding the effect.
    """
    statement = (
        insert_ignoring_conflict(connection, effects)
        .values(
            tenant_id=tenant_id,
            effect_id=effect.effect_id,
            run_id=effect.run_id,
            tool=effect.tool,
            tool_revision=effect.tool_revision,
            target=effect.target,
            idempotency_key=effect.idempotency_key,
            intent_digest=effect.intent_digest,
            arguments=_canonical_text(effect.arguments),
            stage=effect.stage.value,
            created_at=effect.created_at,
            updated_at=effect.updated_at,
            reconciled_by="",
            reconcile_reason="",
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
        .returning(effects.c.effect_id)
    )
    return (await connection.execute(statement)).first() is not None


def _attempt_values(attempt: Attempt) -> dict[str, Any]:
    receipt = attempt.receipt
    return {
        "stage": attempt.stage.value,
        "lease_expires_at": attempt.lease_expires_at,
        "dispatched_at": attempt.dispatched_at,
        "finished_at": attempt.finished_at,
        "outcome_reason": attempt.outcome_reason,
        "failure_evidence": attempt.failure_evidence.value if attempt.failure_evidence else None,
        "receipt_reference": receipt.provider_reference if receipt else None,
        "receipt_detail": _canonical_text(receipt.detail) if receipt else None,
        "receipt_digest": receipt.digest if receipt else None,
        "receipt_recorded_at": receipt.recorded_at if receipt else None,
    }


async def insert_attempt(connection: AsyncConnection, tenant_id: str, attempt: Attempt) -> None:
    await connection.execute(
        prepared("insert_attempt", "", lambda: insert(attempts)),
        dict(
            tenant_id=tenant_id,
            attempt_id=attempt.attempt_id,
            effect_id=attempt.effect_id,
            number=attempt.number,
            provider_key=attempt.provider_key,
            provider_key_reused=attempt.provider_key_reused,
            authorized_at=attempt.authorized_at,
            decision_id=attempt.decision_id,
            approval_id=attempt.approval_id or None,
            principal_id=attempt.principal_id,
            **_attempt_values(attempt),
        ),
    )


async def save_attempt(connection: AsyncConnection, tenant_id: str, attempt: Attempt) -> None:
    query = prepared(
        "save_attempt",
        "",
        lambda: update(attempts).where(
            attempts.c.tenant_id == bindparam("where_tenant_id"), attempts.c.attempt_id == bindparam("where_attempt_id")
        ),
    )
    await connection.execute(
        query, {"where_tenant_id": tenant_id, "where_attempt_id": attempt.attempt_id, **_attempt_values(attempt)}
    )


async def save_effect_state(connection: AsyncConnection, tenant_id: str, effect: Effect) -> None:
    query = prepared(
        "save_effect_state",
        "",
        lambda: update(effects).where(
            effects.c.tenant_id == bindparam("where_tenant_id"), effects.c.effect_id == bindparam("where_effect_id")
        ),
    )
    await connection.execute(
        query,
        {
            "where_tenant_id": tenant_id,
            "where_effect_id": effect.effect_id,
            "stage": effect.stage.value,
            "updated_at": effect.updated_at,
            "reconciled_by": effect.reconciled_by,
            "reconcile_reason": effect.reconcile_reason,
        },
    )


async def expired_lease_effects(connection: AsyncConnection, now: datetime, limit: int) -> list[tuple[str, str]]:
    """(tenant, effect) pairs with an AUTHORIZED or DISPATCHED attempt whose lease ran out."""
    rows = (
        await connection.execute(
            select(attempts.c.tenant_id, attempts.c.effect_id)
            .where(
                attempts.c.stage.in_([Stage.AUTHORIZED.value, Stage.DISPATCHED.value]),
                attempts.c.lease_expires_at <= now,
            )
            .order_by(attempts.c.lease_expires_at)
            .limit(limit)
        )
    ).all()
    return list(dict.fromkeys((row.tenant_id, row.effect_id) for row in rows))


# --- decisions -----------------------------------------------------------------------------


async def insert_decision(connection: AsyncConnection, tenant_id: str, decision: Decision) -> None:
    await connection.execute(
        prepared("insert_decision", "", lambda: insert(decisions)),
        dict(
            tenant_id=tenant_id,
            decision_id=decision.decision_id,
            run_id=decision.run_id,
            effect_id=decision.effect_id,
            attempt_id=decision.attempt_id,
            outcome=decision.outcome.value,
            reasons=_canonical_text([r.as_json() for r in decision.reasons]),
            policy_revision=decision.policy_revision,
            engine=decision.engine,
            input_digest=decision.input_digest,
            input_json=decision.input_json,
            intent_digest=decision.intent_digest,
            idempotency_key=decision.idempotency_key,
            principal_id=decision.principal_id,
            tool=decision.tool,
            created_at=decision.created_at,
        ),
    )


async def get_decision(connection: AsyncConnection, tenant_id: str, decision_id: str) -> Decision | None:
    row = (
        await connection.execute(
            select(decisions).where(decisions.c.tenant_id == tenant_id, decisions.c.decision_id == decision_id)
        )
    ).first()
    if row is None:
        return None
    return decision_of(row, bytes(row.input_json))


def decision_of(row: Row[Any], input_json: bytes) -> Decision:
    """A decision row as the model; ``input_json`` given apart (a listing leaves it out)."""
    return Decision(
        decision_id=row.decision_id,
        run_id=row.run_id,
        effect_id=row.effect_id,
        attempt_id=row.attempt_id,
        outcome=Outcome(row.outcome),
        reasons=tuple(Reason(r["code"], r["message"]) for r in json.loads(row.reasons)),
        policy_revision=row.policy_revision,
        engine=row.engine,
        input_digest=row.input_digest,
        input_json=input_json,
        intent_digest=row.intent_digest,
        idempotency_key=row.idempotency_key,
        principal_id=row.principal_id,
        tool=row.tool,
        created_at=row.created_at,
    )
