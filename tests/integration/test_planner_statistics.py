"""Planner statistics where autovacuum does not keep them: the server analyzes stale tables.

On a table never analyzed, PostgreSQL's planner cannot tell the unique index on
``(tenant_id, idempotency_key)`` from an index that leads with the tenant only, and the plans
each session caches keep whichever it picked while the table grows. The server applies
autovacuum's thresholds itself when autovacuum is off (``Database.maintain_tables``): it analyzes
stale tables and vacuums tables with many dead rows.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from effect_ledger.storage.engine import Database, DatabaseSettings, create_async
from support import create_pg_database, drop_pg_database, migrate

pytestmark = pytest.mark.postgres


def _driver_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def fresh_url():
    url = create_pg_database("el_statistics")
    migrate(url)
    yield url
    drop_pg_database(url)


def _fill(url: str, tenants: int, per_tenant: int) -> None:
    """Effects in a few tenants, as a busy gate leaves them (one run per tenant)."""
    with psycopg.connect(_driver_url(url), autocommit=True) as connection:
        for t in range(tenants):
            tenant = f"t{t}"
            connection.execute(
                "INSERT INTO runs (tenant_id, run_id, created_by, created_at, revision, head_hash, labels, root_run_id)"
                " VALUES (%s, 'r', 'agent', now(), 0, '', '{}', 'r')",
                (tenant,),
            )
            connection.execute(
                "INSERT INTO effects (tenant_id, effect_id, run_id, tool, tool_revision, target, idempotency_key,"
                " intent_digest, arguments, stage, created_at, updated_at, reconciled_by, reconcile_reason)"
                " SELECT %s, 'e' || g, 'r', 'email.send', 1, 'mailto:x', 'k' || g, 'd', '{}', 'AUTHORIZED', now(), now(), '', ''"
                " FROM generate_series(1, %s) g",
                (tenant, per_tenant),
            )


def _key_lookup_index(url: str) -> str:
    with psycopg.connect(_driver_url(url)) as connection:
        plan = connection.execute(
            "EXPLAIN (FORMAT JSON) SELECT * FROM effects WHERE tenant_id = 't1' AND idempotency_key = 'k7'"
        ).fetchone()[0]
    return plan[0]["Plan"].get("Index Name", plan[0]["Plan"]["Node Type"])


def _maintain(url: str, *, vacuum: bool, analyze: bool) -> tuple[list[str], list[str]]:
    """One pass of the server's table maintenance on ``url``: (vacuumed, analyzed)."""

    async def run() -> tuple[list[str], list[str]]:
        database = Database(create_async(DatabaseSettings(url, pool_size=1)))
        try:
            return await database.maintain_tables(vacuum=vacuum, analyze=analyze)
        finally:
            await database.dispose()

    return asyncio.run(run())


def _refresh(url: str) -> list[str]:
    return _maintain(url, vacuum=False, analyze=True)[1]


def _autovacuum(url: str) -> str:
    with psycopg.connect(_driver_url(url)) as connection:
        return connection.execute("SELECT current_setting('autovacuum')").fetchone()[0]


def test_stale_tables_are_analyzed_when_autovacuum_is_off(fresh_url):
    if _autovacuum(fresh_url) == "on":
        pytest.skip("autovacuum is on here: it keeps the statistics itself (see the next test)")
    _fill(fresh_url, tenants=3, per_tenant=2000)
    # Never analyzed, the planner takes an index that leads with the tenant only: every lookup
    # of a key reads the tenant's effects.
    assert _key_lookup_index(fresh_url) != "uq_effects_tenant_id_idempotency_key"
    analyzed = _refresh(fresh_url)
    assert "effects" in analyzed and "runs" not in analyzed  # three runs: below the threshold
    # With statistics, the key is looked up through the unique index, whatever the table's size.
    assert _key_lookup_index(fresh_url) == "uq_effects_tenant_id_idempotency_key"
    # Fresh statistics are not refreshed again until enough rows change.
    assert "effects" not in _refresh(fresh_url)
    _fill_more = 50 + 0.1 * 6000 + 1
    with psycopg.connect(_driver_url(fresh_url), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO effects (tenant_id, effect_id, run_id, tool, tool_revision, target, idempotency_key,"
            " intent_digest, arguments, stage, created_at, updated_at, reconciled_by, reconcile_reason)"
            " SELECT 't0', 'x' || g, 'r', 'email.send', 1, 'mailto:x', 'x' || g, 'd', '{}', 'AUTHORIZED', now(), now(), '', ''"
            " FROM generate_series(1, %s) g",
            (int(_fill_more),),
        )
    assert "effects" in _refresh(fresh_url)


def test_nothing_is_analyzed_when_autovacuum_is_on(fresh_url):
    if _autovacuum(fresh_url) == "off":
        pytest.skip("autovacuum is off here (the previous test covers it)")
    _fill(fresh_url, tenants=1, per_tenant=200)
    assert _refresh(fresh_url) == []


def test_nothing_is_analyzed_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url)
    assert _refresh(url) == []


def _vacuum(url: str) -> list[str]:
    return _maintain(url, vacuum=True, analyze=False)[0]


def _dead_rows(url: str, table: str) -> int:
    with psycopg.connect(_driver_url(url)) as connection:
        return connection.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()[
            0
        ]


def test_a_hot_counter_is_vacuumed_when_autovacuum_is_off(fresh_url):
    """A budget counter is updated by every reservation and settlement; its dead versions are
    vacuumed once they pass autovacuum's threshold (50 + 20 % of the rows), not left to pile up."""
    if _autovacuum(fresh_url) == "on":
        pytest.skip("autovacuum is on here: it vacuums by itself")
    with psycopg.connect(_driver_url(fresh_url), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO budgets (tenant_id, budget_id, scope, scope_id, dimension, limit_amount, posted, pending,"
            " period_started_at, created_at, updated_at) VALUES ('t', 'b', 'TENANT', '', 'usd_micros', 1000000, 0, 0,"
            " now(), now(), now())"
        )
        # A snapshot held open meanwhile keeps page pruning from removing the old versions, as
        # concurrent callers do; then it ends, and only a VACUUM counts them dead and reclaims.
        with psycopg.connect(_driver_url(fresh_url)) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM budgets").fetchone()
            for _ in range(120):
                connection.execute("UPDATE budgets SET pending = pending + 1 WHERE budget_id = 'b'")
            holder.execute("COMMIT")
    # Statistics reach the cumulative views when the updating session reports them.
    for _ in range(50):
        if _dead_rows(fresh_url, "budgets") >= 100:
            break
        time.sleep(0.1)
    assert _dead_rows(fresh_url, "budgets") >= 100
    assert "budgets" in _vacuum(fresh_url)
    assert _dead_rows(fresh_url, "budgets") < 50
    assert "budgets" not in _vacuum(fresh_url)  # below the threshold now


def test_nothing_is_vacuumed_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url)
    assert _vacuum(url) == []
