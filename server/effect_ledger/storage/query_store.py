"""Tenant-wide, keyset-paged reads: effects, runs and decisions of one tenant, in id order.

Ids begin with 16 hex digits of their creation time (``repository.new_id``), so id order is
creation order and the primary key ``(tenant_id, <id>)`` serves the page walk: a page reads
``limit`` index entries after the cursor. A filter narrows the walk (run and tool filters use
the existing ``(tenant_id, run_id, ...)`` and ``(tenant_id, tool, ...)`` indexes).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.model import Decision, Effect, Run
from effect_ledger.storage import repository as repo
from effect_ledger.storage.schema import decisions, effects, runs


def _canonical_text(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


def _created(column: Any, created_after: datetime | None, created_before: datetime | None) -> list[Any]:
    conditions = []
    if created_after is not None:
        conditions.append(column >= created_after)
    if created_before is not None:
        conditions.append(column < created_before)
    return conditions


async def effects_page(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    stages: Sequence[str],
    tool: str,
    run_id: str,
    target: str,
    created_after: datetime | None,
    created_before: datetime | None,
    after_id: str,
    limit: int,
) -> list[Effect]:
    """The first ``limit`` effects after ``after_id`` whose stored row matches, with attempts."""
    conditions = [effects.c.tenant_id == tenant_id, effects.c.effect_id > after_id]
    if stages:
        conditions.append(effects.c.stage.in_(list(stages)))
    if tool:
        conditions.append(effects.c.tool == tool)
    if run_id:
        conditions.append(effects.c.run_id == run_id)
    if target:
        conditions.append(effects.c.target == target)
    conditions += _created(effects.c.created_at, created_after, created_before)
    ids = select(effects.c.effect_id).where(*conditions).order_by(effects.c.effect_id).limit(limit).scalar_subquery()
    return await repo._load_effects(connection, and_(effects.c.tenant_id == tenant_id, effects.c.effect_id.in_(ids)))


async def runs_page(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    label_key: str,
    label_value: str,
    created_after: datetime | None,
    created_before: datetime | None,
    after_id: str,
    limit: int,
) -> list[Run]:
    """The first ``limit`` runs after ``after_id``. The label condition is a prefilter on the
    canonical JSON text (``"key":"value"``); the caller keeps only exact matches."""
    conditions = [runs.c.tenant_id == tenant_id, runs.c.run_id > after_id]
    if label_key:
        fragment = _canonical_text(label_key) + ":" + (_canonical_text(label_value) if label_value else "")
        conditions.append(runs.c.labels.contains(fragment, autoescape=True))
    conditions += _created(runs.c.created_at, created_after, created_before)
    query = select(runs).where(*conditions).order_by(runs.c.run_id).limit(limit)
    return [repo._run(row) for row in (await connection.execute(query)).all()]


# Every column but input_json: a listed decision leaves the policy input to GetDecision.
_LISTED_DECISION_COLUMNS = [c for c in decisions.c if c.name != "input_json"]


def _listed_decision(row: Row[Any]) -> Decision:
    return repo.decision_of(row, b"")


async def decisions_page(
    connection: AsyncConnection,
    tenant_id: str,
    *,
    outcome: str,
    reason_code: str,
    run_id: str,
    tool: str,
    after_id: str,
    limit: int,
) -> list[Decision]:
    """The first ``limit`` matching decisions after ``after_id``, without their input.

    ``reasons`` is a canonical JSON array of ``{"code", "message"}`` objects: the text
    ``"code":"<code>"`` occurs only as a reason's code (a quote inside a string is escaped)."""
    conditions = [decisions.c.tenant_id == tenant_id, decisions.c.decision_id > after_id]
    if outcome:
        conditions.append(decisions.c.outcome == outcome)
    if reason_code:
        conditions.append(decisions.c.reasons.contains('"code":' + _canonical_text(reason_code), autoescape=True))
    if run_id:
        conditions.append(decisions.c.run_id == run_id)
    if tool:
        conditions.append(decisions.c.tool == tool)
    query = select(*_LISTED_DECISION_COLUMNS).where(*conditions).order_by(decisions.c.decision_id).limit(limit)
    return [_listed_decision(row) for row in (await connection.execute(query)).all()]
