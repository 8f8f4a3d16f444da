"""Alembic environment. Runs on a connection handed over by effect_ledger.storage.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from effect_ledger.storage.schema import metadata

# An arbitrary 64-bit key: concurrent replicas starting on one PostgreSQL migrate one at a time.
MIGRATION_LOCK_KEY = 7_251_093_415_226_001


def run_migrations_online() -> None:
    connection = context.config.attributes["connection"]
    is_postgres = connection.dialect.name == "postgresql"
    if is_postgres:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=not is_postgres,
        compare_type=True,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `effect-ledger migrate`")
run_migrations_online()
