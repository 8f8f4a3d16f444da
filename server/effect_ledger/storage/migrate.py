"""Apply Alembic migrations (the only way the schema changes outside tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection=None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(engine: Engine) -> None:
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "head")


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
