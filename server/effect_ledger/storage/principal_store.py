"""Principals and their tokens: the rows the Principals service reads and changes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain.model import Role
from effect_ledger.storage.schema import principals


@dataclass(frozen=True)
class PrincipalRecord:
    tenant_id: str
    principal_id: str
    roles: frozenset[Role]
    created_at: datetime
    disabled_at: datetime | None
    token_expires_at: datetime | None
    token_issued_at: datetime | None
    client_subject: str | None


def _record(row: Any) -> PrincipalRecord:
    return PrincipalRecord(
        tenant_id=row.tenant_id,
        principal_id=row.principal_id,
        roles=frozenset(Role(r) for r in json.loads(row.roles)),
        created_at=row.created_at,
        disabled_at=row.disabled_at,
        token_expires_at=row.token_expires_at,
        token_issued_at=row.token_issued_at,
        client_subject=row.client_subject,
    )


_COLUMNS = (
    principals.c.tenant_id,
    principals.c.principal_id,
    principals.c.roles,
    principals.c.created_at,
    principals.c.disabled_at,
    principals.c.token_expires_at,
    principals.c.token_issued_at,
    principals.c.client_subject,
)


async def listed(connection: AsyncConnection, tenant_id: str, after_id: str, limit: int) -> list[PrincipalRecord]:
    query = (
        select(*_COLUMNS)
        .where(principals.c.tenant_id == tenant_id, principals.c.principal_id > after_id)
        .order_by(principals.c.principal_id)
        .limit(limit)
    )
    return [_record(row) for row in (await connection.execute(query)).all()]


async def get(
    connection: AsyncConnection, tenant_id: str, principal_id: str, *, lock: bool = False
) -> PrincipalRecord | None:
    """The principal's row (``lock``: locked until commit, on PostgreSQL), or None."""
    query = select(*_COLUMNS).where(principals.c.tenant_id == tenant_id, principals.c.principal_id == principal_id)
    if lock and connection.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await connection.execute(query)).first()
    return _record(row) if row is not None else None


async def change(connection: AsyncConnection, tenant_id: str, principal_id: str, **values: Any) -> None:
    await connection.execute(
        update(principals)
        .where(principals.c.tenant_id == tenant_id, principals.c.principal_id == principal_id)
        .values(**values)
    )
