"""A connection that breaks while COMMIT is in flight is reported as an unknown outcome,
not as a failure: the write may have landed (clients retry with the same key)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from effect_ledger.errors import CommitOutcomeUnknown, StorageUnavailable
from effect_ledger.storage.engine import Database, DatabaseSettings, create_async


async def _run(url: str, fail_at_commit: bool) -> Exception | None:
    database = Database(create_async(DatabaseSettings(url, pool_size=1)))
    try:

        async def work(unit):
            await unit.connection.execute(text("SELECT 1"))
            if fail_at_commit:
                # Break the connection under the transaction: the next statement is COMMIT.
                raw = await unit.connection.get_raw_connection()
                raw.driver_connection.pgconn.finish()
            return "ok"

        try:
            await database.run(work)
        except Exception as error:
            return error
        return None
    finally:
        await database.dispose()


@pytest.mark.postgres
def test_a_broken_commit_is_an_unknown_outcome(pg_url):
    error = asyncio.run(_run(pg_url, fail_at_commit=True))
    assert isinstance(error, CommitOutcomeUnknown), repr(error)
    assert error.reason == "COMMIT_OUTCOME_UNKNOWN" and isinstance(error, StorageUnavailable) is False
    assert asyncio.run(_run(pg_url, fail_at_commit=False)) is None
