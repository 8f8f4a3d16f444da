"""Where PostgreSQL and SQLite differ, in one place: the URL forms, the database clock (read
inside another query, or on its own), and the insert that ignores a conflicting row. Code that
needs a feature only one of them has asks ``is_postgresql``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

POSTGRESQL = "postgresql"


def is_postgresql(connection: AsyncConnection) -> bool:
    return bool(connection.dialect.name == POSTGRESQL)


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` as psycopg 3; keep SQLite URLs as they are."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_sqlite(url: str) -> bool:
    return make_url(normalize_url(url)).get_backend_name() == "sqlite"


def clock_expression(dialect_name: str) -> Any:
    """The database clock as a column expression, to read it within another query."""
    if dialect_name == POSTGRESQL:
        return func.clock_timestamp().label("database_now")
    return func.strftime("%Y-%m-%d %H:%M:%f", "now").label("database_now")


def clock_value(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)


async def database_now(connection: AsyncConnection) -> datetime:
    """The database's clock: leases and expiries are judged by it, never by a replica's clock."""
    value = (await connection.execute(select(clock_expression(connection.dialect.name)))).scalar_one()
    return clock_value(value)


def insert_ignoring_conflict(connection: AsyncConnection, table: Any) -> Any:
    """An INSERT that can take ``on_conflict_do_nothing`` (both dialects spell it alike)."""
    return (postgresql if is_postgresql(connection) else sqlite).insert(table)
