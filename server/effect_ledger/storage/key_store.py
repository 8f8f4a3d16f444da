"""The deployment's checkpoint keys (table ``checkpoint_keys``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from effect_ledger.domain import signing
from effect_ledger.storage.dialect import insert_ignoring_conflict
from effect_ledger.storage.schema import checkpoint_keys


@dataclass(frozen=True)
class KeyRow:
    key_id: str
    public_key: str
    private_key: str | None
    note: str
    created_at: datetime
    retired_at: datetime | None

    @property
    def own(self) -> bool:
        return self.private_key is not None


async def list_keys(connection: AsyncConnection) -> list[KeyRow]:
    rows = await connection.execute(
        select(checkpoint_keys)
        .order_by(checkpoint_keys.c.created_at, checkpoint_keys.c.key_id)
        .limit(signing.TRUSTED_KEYS_MAX)
    )
    return [KeyRow(r.key_id, r.public_key, r.private_key, r.note, r.created_at, r.retired_at) for r in rows]


def active(keys: list[KeyRow]) -> KeyRow | None:
    """The key that signs exports: the oldest own key not retired (one rule for every replica,
    so two replicas that each generated a key at the same first start sign with the same one)."""
    for key in keys:
        if key.own and key.retired_at is None:
            return key
    return None


async def add(
    connection: AsyncConnection, *, key_id: str, public_key: str, private_key: str | None, note: str, now: datetime
) -> None:
    await connection.execute(
        insert_ignoring_conflict(connection, checkpoint_keys)
        .values(
            key_id=key_id, public_key=public_key, private_key=private_key, note=note, created_at=now, retired_at=None
        )
        .on_conflict_do_nothing(index_elements=["key_id"])
    )


async def ensure_signing_key(connection: AsyncConnection, now: datetime) -> KeyRow:
    """The active signing key, generated (and kept in the database) when there is none."""
    key = active(await list_keys(connection))
    if key is None:
        pair = signing.generate()
        await add(
            connection,
            key_id=pair.key_id,
            public_key=pair.public_pem,
            private_key=pair.private_pem,
            note="generated at first start",
            now=now,
        )
        key = active(await list_keys(connection))
    assert key is not None
    return key


async def rotate(connection: AsyncConnection, now: datetime, note: str) -> KeyRow:
    """A new own key signs from now on; the previous ones are retired (they still verify)."""
    await connection.execute(
        update(checkpoint_keys)
        .where(checkpoint_keys.c.private_key.is_not(None), checkpoint_keys.c.retired_at.is_(None))
        .values(retired_at=now)
    )
    pair = signing.generate()
    await add(
        connection, key_id=pair.key_id, public_key=pair.public_pem, private_key=pair.private_pem, note=note, now=now
    )
    key = active(await list_keys(connection))
    assert key is not None and key.key_id == pair.key_id
    return key


async def forget(connection: AsyncConnection, key_id: str) -> bool:
    """Remove a key: archives it signed no longer verify here (the caller refuses to remove
    the active signing key; rotate first)."""
    result = await connection.execute(checkpoint_keys.delete().where(checkpoint_keys.c.key_id == key_id))
    return bool(result.rowcount)
