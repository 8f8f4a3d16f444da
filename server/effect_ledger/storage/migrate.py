"""Apply Alembic migrations (the only way the schema changes outside tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection=None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


# The PostgreSQL advisory lock every replica takes around its upgrade, so that replicas starting
# together (and `effect-ledger migrate` jobs) migrate one at a time; each waiting one then finds
# the schema at head and does nothing. migrations/env.py takes the same key per transaction
# (advisory locks are reentrant within a session). SQLite needs none: its migration runs in one
# write transaction, and SQLite lets one writer at a time into a database file (the others wait
# out busy_timeout), so a second upgrade starts only after the first committed.
MIGRATION_LOCK_KEY = 7_251_093_415_226_001
# How long a replica waits for another's migration before giving up (a migration of this schema
# takes seconds; one still running after this is stuck, and the service manager should see it).
MIGRATION_LOCK_WAIT_SECONDS_MAX = 300


def upgrade_to_head(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), "head")
        return
    with engine.connect() as connection:
        _lock_migrations(connection)
        try:
            with connection.begin():
                command.upgrade(alembic_config(connection), "head")
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()


def _lock_migrations(connection: Connection) -> None:
    """Take the session-level migration lock, waiting at most MIGRATION_LOCK_WAIT_SECONDS_MAX."""
    try:
        with connection.begin():
            # SET LOCAL: the limit ends with this transaction; the session-level lock does not.
            connection.execute(text(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_WAIT_SECONDS_MAX}s'"))
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    except OperationalError as error:
        raise SystemExit(
            f"another process has been migrating this database for {MIGRATION_LOCK_WAIT_SECONDS_MAX} s; "
            f"giving up ({type(error.orig).__name__})"
        ) from None


def is_at_head(engine: Engine) -> tuple[bool, str | None, str | None]:
    """Whether the schema is at the newest migration; with the current and newest revisions."""
    current, head = current_revision(engine), head_revision()
    return current == head, current, head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def check_durable_commits(engine: Engine) -> None:
    """Refuse to run on a PostgreSQL that acknowledges commits it may lose."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as connection:
        value = connection.execute(text("SHOW synchronous_commit")).scalar_one()
    if str(value).lower() == "off":
        raise SystemExit(
            "refusing to start: PostgreSQL synchronous_commit is off, so an acknowledged "
            "decision could be lost in a crash; set it to on"
        )
