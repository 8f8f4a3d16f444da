"""Alembic migrations against real PostgreSQL and SQLite: an empty database reaches the models.

Drift is judged by Alembic's own autogenerate comparison with types and server defaults
compared. ``UtcDateTime`` needs no special handling: Alembic compares a TypeDecorator by its
``impl`` (``DateTime(timezone=True)``), which matches the reflected ``TIMESTAMP WITH TIME ZONE``
on PostgreSQL and ``DATETIME`` on SQLite. ``test_the_drift_check_sees_drift`` shows the
comparison is not blind (it finds a planted column, index and type change, including
timestamptz against timestamp on PostgreSQL; SQLite has no such distinction to find).
Autogenerate ignores CHECK constraints, so those are compared by name separately.
"""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    MetaData,
    String,
    Text,
    event,
    inspect,
    text,
)

from effect_ledger.storage.engine import DatabaseSettings, create_sync
from effect_ledger.storage.migrate import (
    check_durable_commits,
    current_revision,
    head_revision,
    upgrade_to_head,
)
from effect_ledger.storage.schema import NAMING_CONVENTION, metadata
from support import PG_ADMIN_URL, create_pg_database, drop_pg_database

ALEMBIC_TABLE = "alembic_version"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request, tmp_path):
    """The URL of a database with nothing in it, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    url = create_pg_database("el_migrations")
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def engine(empty_url):
    engine = create_sync(DatabaseSettings(empty_url))
    yield engine
    engine.dispose()


@pytest.fixture
def migrated(engine):
    upgrade_to_head(engine)
    return engine


def drift(engine, models: MetaData = metadata) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(context, models)


def check_constraint_names(engine) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(in the database, in the models): (table, name) of every CHECK constraint."""
    inspector = inspect(engine)
    in_database = {
        (table, check["name"]) for table in metadata.tables for check in inspector.get_check_constraints(table)
    }
    in_models = {
        (table.name, str(constraint.name))
        for table in metadata.sorted_tables
        for constraint in table.constraints
        if isinstance(constraint, CheckConstraint)
    }
    return in_database, in_models


def test_an_empty_database_is_upgraded_to_head(engine):
    assert inspect(engine).get_table_names() == []
    assert current_revision(engine) is None
    upgrade_to_head(engine)
    assert head_revision() is not None
    assert current_revision(engine) == head_revision()
    assert set(inspect(engine).get_table_names()) == set(metadata.tables) | {ALEMBIC_TABLE}


def test_the_migrated_database_and_the_models_do_not_drift(migrated):
    assert drift(migrated) == []
    in_database, in_models = check_constraint_names(migrated)
    assert in_database == in_models


def test_the_drift_check_sees_drift(migrated):
    models = MetaData(naming_convention=NAMING_CONVENTION)
    for table in metadata.sorted_tables:
        table.to_metadata(models)
    runs, decisions = models.tables["runs"], models.tables["decisions"]
    runs.append_column(Column("planted", Text, nullable=True))
    Index(None, runs.c.created_by)
    decisions.c.engine.type = String(decisions.c.engine.type.length + 1)
    runs.c.created_at.type = DateTime(timezone=False)
    found = drift(migrated, models)
    kinds = set()
    for entry in found:
        entries = entry if isinstance(entry, list) else [entry]
        kinds |= {(e[0], e[2] if e[0] == "modify_type" else None) for e in entries}
    assert ("add_column", None) in kinds
    assert ("add_index", None) in kinds
    assert ("modify_type", "decisions") in kinds
    if migrated.dialect.name == "postgresql":
        assert (
            "modify_type",
            "runs",
        ) in kinds  # timestamptz in the database, timestamp in the models


# The deployment's own state, not a tenant's: its checkpoint signing keys.
DEPLOYMENT_TABLES = {"checkpoint_keys"}


def test_every_primary_key_starts_with_tenant_id(migrated):
    inspector = inspect(migrated)
    tables = [name for name in inspector.get_table_names() if name != ALEMBIC_TABLE]
    assert sorted(tables) == sorted(metadata.tables)
    for table in tables:
        primary_key = inspector.get_pk_constraint(table)
        if table in DEPLOYMENT_TABLES:
            assert "tenant_id" not in [c["name"] for c in inspector.get_columns(table)], table
        else:
            assert primary_key["constrained_columns"][0] == "tenant_id", table
        assert primary_key["name"] == f"pk_{table}", table  # the naming convention holds on both dialects


def test_upgrading_twice_is_a_no_op(migrated):
    with migrated.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO principals (tenant_id, principal_id, token_hash, roles, created_at) "
                "VALUES ('acme', 'agent-1', :token_hash, '[\"agent\"]', CURRENT_TIMESTAMP)"
            ),
            {"token_hash": "a" * 64},
        )
    tables_before = sorted(inspect(migrated).get_table_names())
    upgrade_to_head(migrated)
    assert current_revision(migrated) == head_revision()
    assert sorted(inspect(migrated).get_table_names()) == tables_before
    assert drift(migrated) == []
    with migrated.connect() as connection:
        assert connection.execute(text(f"SELECT count(*) FROM {ALEMBIC_TABLE}")).scalar_one() == 1
        assert connection.execute(text("SELECT principal_id FROM principals")).scalars().all() == ["agent-1"]


def test_check_durable_commits_has_nothing_to_check_on_sqlite(tmp_path):
    engine = create_sync(DatabaseSettings(f"sqlite:///{tmp_path / 'ledger.db'}"))
    try:
        check_durable_commits(engine)
    finally:
        engine.dispose()


# --- PostgreSQL: refuse to run when commits are acknowledged before they are durable -------------


@pytest.fixture
def pg_url():
    url = create_pg_database("el_durable")
    try:
        yield url
    finally:
        drop_pg_database(url)


def set_database_default(url: str, value: str | None) -> None:
    name = url.rsplit("/", 1)[1]
    clause = "RESET synchronous_commit" if value is None else f"SET synchronous_commit = {value}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'ALTER DATABASE "{name}" {clause}')


def shown_synchronous_commit(engine) -> str:
    with engine.connect() as connection:
        return connection.execute(text("SHOW synchronous_commit")).scalar_one()


@pytest.mark.postgres
def test_durable_commits_pass_when_synchronous_commit_is_on(pg_url):
    engine = create_sync(DatabaseSettings(pg_url))
    try:
        assert shown_synchronous_commit(engine) == "on"
        check_durable_commits(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_durable_commits_refused_when_the_database_turns_synchronous_commit_off(pg_url):
    set_database_default(pg_url, "off")
    engine = create_sync(DatabaseSettings(pg_url))
    try:
        assert shown_synchronous_commit(engine) == "off"
        with pytest.raises(SystemExit) as refused:
            check_durable_commits(engine)
        assert "synchronous_commit is off" in str(refused.value)
    finally:
        engine.dispose()
    set_database_default(pg_url, None)
    engine = create_sync(DatabaseSettings(pg_url))
    try:
        check_durable_commits(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_durable_commits_refused_when_the_session_turns_synchronous_commit_off(pg_url):
    # What a connection option (-c synchronous_commit=off) does, set as each connection opens.
    engine = create_sync(DatabaseSettings(pg_url))

    @event.listens_for(engine, "connect")
    def _turn_off(dbapi_connection, _record):
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
        dbapi_connection.commit()

    try:
        assert shown_synchronous_commit(engine) == "off"
        with pytest.raises(SystemExit):
            check_durable_commits(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_durable_commits_refused_when_the_url_turns_synchronous_commit_off(pg_url):
    engine = create_sync(DatabaseSettings(pg_url + "?options=-c%20synchronous_commit%3Doff"))
    try:
        assert shown_synchronous_commit(engine) == "off"
        with pytest.raises(SystemExit):
            check_durable_commits(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_url_options_are_kept_and_the_service_limits_still_win(pg_url):
    settings = DatabaseSettings(
        pg_url + "?options=-c%20application_name%3Dledger-test%20-c%20statement_timeout%3D1",
        statement_timeout_ms=4321,
    )
    engine = create_sync(settings)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SHOW application_name")).scalar_one() == "ledger-test"
            assert connection.execute(text("SHOW statement_timeout")).scalar_one() == "4321ms"
    finally:
        engine.dispose()
