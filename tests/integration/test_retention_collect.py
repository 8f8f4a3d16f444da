"""The retention collector on the storage it runs against, without a server: two collectors at
once (as two replicas would run them) remove each row once and tombstone it once, on both
backends; a second collection finds nothing. Small (3,000 decisions): the figure for 100,000 is
the benchmark's (bench/retention_collect.py)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, insert, select

from effect_ledger.domain.retention import Kind
from effect_ledger.service import retention
from effect_ledger.storage.engine import Database, DatabaseSettings, create_async, create_sync
from effect_ledger.storage.schema import decisions, retention_rules, runs, tombstones
from support import create_pg_database, drop_pg_database, migrate

TENANT, RUN_ID = "t-collect", "run_expired"
ROWS = 3000
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request):
    if request.param == "postgres":
        made = create_pg_database("el_collect")
    else:
        made = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='el-collect-'), 'ledger.db')}"
    migrate(made)
    _fill(made)
    yield made
    if request.param == "postgres":
        drop_pg_database(made)


def _fill(url: str) -> None:
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(runs).values(
                    tenant_id=TENANT,
                    run_id=RUN_ID,
                    created_by="test",
                    created_at=LONG_AGO,
                    revision=0,
                    head_hash="",
                    labels="{}",
                    root_run_id=RUN_ID,
                )
            )
            connection.execute(
                insert(decisions),
                [
                    {
                        "tenant_id": TENANT,
                        "decision_id": f"dec_{index:016x}",
                        "run_id": RUN_ID,
                        "outcome": "ALLOW",
                        "reasons": "[]",
                        "policy_revision": "test",
                        "engine": "embedded",
                        "input_digest": "a" * 64,
                        "input_json": b'{"n":1}',
                        "intent_digest": "b" * 64,
                        "idempotency_key": f"key-{index}",
                        "principal_id": "agent",
                        "tool": "email.send",
                        "created_at": LONG_AGO,
                    }
                    for index in range(ROWS)
                ],
            )
            connection.execute(
                insert(retention_rules).values(
                    tenant_id=TENANT, kind="DECISIONS", max_age_seconds=3600, updated_by="test", updated_at=LONG_AGO
                )
            )
    finally:
        engine.dispose()


async def _collect_twice_at_once(url: str) -> list[int]:
    databases = [Database(create_async(DatabaseSettings(url))) for _ in range(2)]
    try:
        found = await asyncio.gather(
            *(
                retention.collect(database, TENANT, f"replica-{index}", dry_run=False, batches_max=100)
                for index, database in enumerate(databases)
            )
        )
        again = await retention.collect(databases[0], TENANT, "replica-0", dry_run=False, batches_max=100)
        assert again.removed[Kind.DECISIONS] == 0 and again.tombstones_written == 0
        return [counts.removed[Kind.DECISIONS] for counts in found]
    finally:
        for database in databases:
            await database.dispose()


def test_two_collectors_at_once_remove_and_tombstone_each_row_once(url):
    removed = asyncio.run(_collect_twice_at_once(url))

    assert sum(removed) == ROWS
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.connect() as connection:
            left = connection.execute(select(func.count()).select_from(decisions)).scalar_one()
            written, subjects = connection.execute(
                select(func.count(), func.count(tombstones.c.subject.distinct())).where(
                    tombstones.c.tenant_id == TENANT
                )
            ).one()
    finally:
        engine.dispose()
    assert left == 0
    assert written == subjects == ROWS, "one tombstone per removed decision, none twice"
