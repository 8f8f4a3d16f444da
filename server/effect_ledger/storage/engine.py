"""The one engine factory, and the unit of work every RPC runs in.

The factory branches on the URL: ``postgresql+psycopg`` for PostgreSQL, and a SQLite file with
``busy_timeout``, ``foreign_keys=ON`` and ``BEGIN IMMEDIATE`` transactions for the embedded
default. Every pool size and timeout is explicit, with the reason beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from effect_ledger.errors import (
    CommitOutcomeUnknown,
    CommitThenRaise,
    Conflict,
    LedgerError,
    StorageUnavailable,
)
from effect_ledger.faults import crash_point
from effect_ledger.observability import tracing
from effect_ledger.storage import round_trips
from effect_ledger.storage.dialect import database_now, is_sqlite, normalize_url
from effect_ledger.storage.trace_store import append_events

log = logging.getLogger(__name__)

T = TypeVar("T")

# PostgreSQL SQLSTATEs that mean "a concurrent transaction won; run the unit of work again".
RETRYABLE_SQLSTATES = {"40001", "40P01", "23505"}
UNIT_OF_WORK_ATTEMPTS_MAX = 5


@dataclass(frozen=True)
class DatabaseSettings:
    url: str
    # Connections each server process keeps. With a two-core host and several replicas, ten
    # per process keeps PostgreSQL's max_connections (100 by default) well out of reach.
    pool_size: int = 10
    # How long an RPC waits for a free connection before answering UNAVAILABLE.
    pool_timeout_seconds: float = 5.0
    # A statement that runs longer than this is cancelled by PostgreSQL (fail, don't hang).
    statement_timeout_ms: int = 5000
    # A row lock waited on longer than this fails the statement (and the RPC is retried/refused).
    lock_timeout_ms: int = 3000
    # SQLite: how long a writer waits for the file lock held by another writer.
    sqlite_busy_timeout_ms: int = 5000


def _ensure_sqlite_folder(url: str) -> None:
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    # Autocommit at the driver level so that SQLAlchemy's "begin" event issues BEGIN IMMEDIATE:
    # a writer takes the file's write lock at the start of its transaction, so two writers never
    # both read and then deadlock on upgrade.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL lets readers proceed while one writer writes.
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed transaction survives power loss (NORMAL would not, in WAL mode).
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cursor.close()


def _install_sqlite_events(sync_engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        _sqlite_pragmas(dbapi_connection, busy_timeout_ms)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _postgres_connect_args(settings: DatabaseSettings) -> dict[str, Any]:
    # connect_args replace the URL's own ``?options=``: keep those (the operator's search_path,
    # synchronous_commit, ...) in front, so the limits below still win where both set one.
    given = make_url(normalize_url(settings.url)).query.get("options", ())
    given_text = " ".join(given) if isinstance(given, tuple) else given
    options = (
        (f"{given_text} " if given_text else "") + f"-c statement_timeout={settings.statement_timeout_ms} "
        f"-c lock_timeout={settings.lock_timeout_ms} "
        # A transaction left open by a stuck process releases its locks after 30 s.
        "-c idle_in_transaction_session_timeout=30000"
    )
    # connect_timeout: a database that does not answer is UNAVAILABLE within 5 s.
    return {"connect_timeout": 5, "options": options}


def create_async(settings: DatabaseSettings) -> AsyncEngine:
    url = normalize_url(settings.url)
    if is_sqlite(url):
        _ensure_sqlite_folder(url)
        async_url = make_url(url).set(drivername="sqlite+aiosqlite")
        engine = create_async_engine(
            async_url,
            pool_size=settings.pool_size,
            max_overflow=0,
            pool_timeout=settings.pool_timeout_seconds,
        )
        _install_sqlite_events(engine.sync_engine, settings.sqlite_busy_timeout_ms)
        if round_trips.enabled:  # the benchmark's count of database round trips per RPC
            round_trips.install(engine.sync_engine)
        return engine
    engine = create_async_engine(
        url,
        pool_size=settings.pool_size,
        # No overflow: the pool size is the ceiling each process puts on the database.
        max_overflow=0,
        pool_timeout=settings.pool_timeout_seconds,
        # Recycle connections every 5 minutes so a failover or restart does not keep dead ones.
        pool_recycle=300,
        # No pre-ping: it costs a round trip per RPC. A dead connection fails its statement,
        # the pool discards it, and the RPC answers UNAVAILABLE (writing nothing).
        pool_pre_ping=False,
        connect_args=_postgres_connect_args(settings),
    )
    if round_trips.enabled:
        round_trips.install(engine.sync_engine)
    return engine


def create_sync(settings: DatabaseSettings) -> Engine:
    """A synchronous engine for the command line (migrations, principals, verify)."""
    url = normalize_url(settings.url)
    if is_sqlite(url):
        _ensure_sqlite_folder(url)
        engine = create_engine(url, pool_size=1, max_overflow=0)
        _install_sqlite_events(engine, settings.sqlite_busy_timeout_ms)
        return engine
    return create_engine(url, pool_size=1, max_overflow=0, connect_args=_postgres_connect_args(settings))


def default_sqlite_url(folder: str = ".effect-ledger") -> str:
    return f"sqlite:///{os.path.abspath(os.path.join(folder, 'ledger.db'))}"


# --- the unit of work ----------------------------------------------------------------------


@dataclass
class UnitOfWork:
    """One database transaction, with the database clock read once at its start.

    Trace events recorded during the work are appended to their runs' hash chains just
    before commit, in the same transaction as the changes they describe.
    """

    connection: AsyncConnection
    now: datetime
    events: dict[tuple[str, str], list[tuple[str, dict[str, Any], str]]] = field(default_factory=dict)

    def record_event(
        self, tenant_id: str, run_id: str, event_type: str, payload: dict[str, Any], principal_id: str
    ) -> None:
        self.events.setdefault((tenant_id, run_id), []).append((event_type, payload, principal_id))

    async def flush_events_for(self, tenant_id: str, run_id: str) -> int:
        """Append this run's pending events now; returns the run's new head revision."""
        pending = self.events.pop((tenant_id, run_id), [])
        return await append_events(self.connection, tenant_id, run_id, pending, self.now)

    async def flush_events(self) -> None:
        for (tenant_id, run_id), pending in sorted(self.events.items()):
            await append_events(self.connection, tenant_id, run_id, pending, self.now)
        self.events.clear()


def _sqlstate(error: DBAPIError) -> str | None:
    original = getattr(error, "orig", None)
    return getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)


def classify(error: Exception) -> LedgerError | None:
    """Map a database error to the domain's: a lost race is Conflict, an outage is Unavailable."""
    if isinstance(error, PoolTimeoutError):
        return StorageUnavailable("no database connection became free in time")
    if isinstance(error, IntegrityError):
        if _sqlstate(error) == "23505" or "UNIQUE constraint failed" in str(error):
            return Conflict("a concurrent request created the same record")
        return None
    if isinstance(error, DBAPIError):
        state = _sqlstate(error)
        if state in RETRYABLE_SQLSTATES:
            return Conflict(f"concurrent update (SQLSTATE {state})")
        if error.connection_invalidated or isinstance(error, OperationalError):
            if "database is locked" in str(error):
                return Conflict("the SQLite database is locked by another writer")
            return StorageUnavailable("the database is unavailable")
        if state is not None and state[:2] in {"08", "57", "53"}:
            # connection exception, operator intervention (shutdown, statement timeout), resources
            return StorageUnavailable(f"the database is unavailable (SQLSTATE {state})")
    if isinstance(error, (ConnectionError, OSError)):
        return StorageUnavailable("the database is unreachable")
    return None


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


def classify_driver(error: Exception) -> LedgerError | None:
    """``classify`` for errors psycopg raises itself (the driver path, without SQLAlchemy)."""
    import psycopg

    if isinstance(error, PoolTimeoutError):
        return StorageUnavailable("no database connection became free in time")
    if not isinstance(error, psycopg.Error):
        return classify(error)
    state = error.sqlstate
    if state in RETRYABLE_SQLSTATES:
        return Conflict(f"concurrent update (SQLSTATE {state})")
    if isinstance(error, psycopg.OperationalError) or (state is not None and state[:2] in {"08", "57", "53"}):
        return StorageUnavailable(f"the database is unavailable (SQLSTATE {state})")
    return None


class Database:
    """Runs units of work: one transaction each, retried from the start when a race is lost."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        # Each attempt at a unit of work is one span, when tracing is on.
        self._span_attributes = {"db.system": self.dialect}
        # maintain_tables: the dead rows each table still held after its last VACUUM here.
        self._dead_rows_left: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def _transaction(self, read_clock: bool) -> AsyncIterator[UnitOfWork]:
        with tracing.span(tracing.TRANSACTION_SPAN, self._span_attributes):
            async with self.engine.connect() as connection:
                transaction = await connection.begin()
                try:
                    # Callers that read the clock within their first query (authentication) skip
                    # the separate round trip.
                    now = await database_now(connection) if read_clock else datetime.min.replace(tzinfo=UTC)
                    unit = UnitOfWork(connection, now)
                    yield unit
                    await unit.flush_events()
                    crash_point("before_commit")
                except BaseException:
                    with contextlib.suppress(Exception):
                        await transaction.rollback()
                    raise
                try:
                    await transaction.commit()
                except Exception as error:
                    # The COMMIT was sent and no answer came back: it may or may not have landed.
                    raise CommitOutcomeUnknown(
                        "the database connection failed during commit: the outcome is unknown; "
                        "retry with the same idempotency key and the ledger will answer what happened"
                    ) from error

    async def run(self, work: Callable[[UnitOfWork], Awaitable[T]], *, read_clock: bool = True) -> T:
        """Run ``work`` in one transaction; nothing it wrote survives an error it raises.

        ``CommitThenRaise`` commits first, then raises its error (a refused report kept in the trace).
        """
        last: LedgerError | None = None
        for _ in range(UNIT_OF_WORK_ATTEMPTS_MAX):
            pending: CommitThenRaise | None = None
            try:
                async with self._transaction(read_clock) as unit:
                    try:
                        result = await work(unit)
                    except CommitThenRaise as commit_then_raise:
                        pending = commit_then_raise
            except Conflict as conflict:
                # The work itself saw that it lost a race (the transaction was rolled back):
                # run it again, so it answers from what the winner committed.
                last = conflict
                continue
            except LedgerError:
                raise
            except Exception as error:
                mapped = classify(error)
                if mapped is None:
                    raise
                if isinstance(mapped, Conflict):
                    last = mapped
                    continue
                raise mapped from error
            if pending is not None:
                raise pending.error  # committed: never retried
            return result
        assert last is not None
        raise last

    async def run_driver(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """PostgreSQL only: run ``work`` with the pooled psycopg connection itself (no ORM).

        ``work`` begins and commits its own transaction (see ``storage/gate_store.py``); when
        it raises, the transaction is rolled back. A race lost (serialization failure, deadlock,
        unique violation, or ``Conflict``) runs it again, as ``run`` does; a connection that
        broke while its commit was in flight answers ``CommitOutcomeUnknown``.
        """
        last: LedgerError | None = None
        for _ in range(UNIT_OF_WORK_ATTEMPTS_MAX):
            try:
                async with self._driver_connection() as connection:
                    driver = (await connection.get_raw_connection()).driver_connection
                    assert driver is not None, "a pooled connection has its driver connection"
                    # The work sends BEGIN and COMMIT itself, inside its query strings.
                    await driver.set_autocommit(True)
                    try:
                        result = await work(driver)
                        if driver.info.transaction_status != _IDLE:  # it read and wrote nothing
                            await driver.execute("ROLLBACK")
                            round_trips.note()
                        return result
                    except BaseException:
                        if driver.broken:
                            await connection.invalidate()
                        elif driver.info.transaction_status != _IDLE:
                            with contextlib.suppress(Exception):
                                await driver.execute("ROLLBACK")
                        raise
                    finally:
                        if not driver.broken:
                            await driver.set_autocommit(False)
            except Conflict as conflict:
                last = conflict
                continue
            except LedgerError:
                raise
            except Exception as error:
                mapped = classify_driver(error)
                if mapped is None:
                    raise
                if isinstance(mapped, Conflict):
                    last = mapped
                    continue
                raise mapped from error
        assert last is not None
        raise last

    def _driver_connection(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A pooled connection for ``run_driver``'s work; with tracing on, inside a span."""
        if tracing.enabled():
            return self._traced_connection()
        return self.engine.connect()

    @contextlib.asynccontextmanager
    async def _traced_connection(self) -> AsyncIterator[AsyncConnection]:
        with tracing.span(tracing.TRANSACTION_SPAN, self._span_attributes):
            async with self.engine.connect() as connection:
                yield connection

    async def maintain_tables(self, *, vacuum: bool = True, analyze: bool = True) -> tuple[list[str], list[str]]:
        """PostgreSQL with autovacuum off: do its work, by its own thresholds. Returns the tables
        vacuumed and the tables analyzed (none on SQLite or with autovacuum on).

        Analyze. Without statistics the planner cannot tell a unique index from a wide one: on a
        table never analyzed it may look an idempotency key up through an index that leads with
        the tenant only, and the plans cached in each session (the gate's functions, foreign-key
        checks) keep that choice while the table grows. A table is analyzed once its changes
        since the last ANALYZE pass ``50 + 10 %`` of its rows.

        Vacuum. A budget counter or a run head is updated by every call that reserves or
        appends. Left unvacuumed, its table keeps every dead version: measured in a soak, the
        one-row budgets table reached 283 pages after 50,000 updates, each read of it scanned
        them all (45 ms), and the effect cycle rate fell from about 100/s to 60/s within five
        minutes. A table is vacuumed once the rows that died since its last VACUUM here pass
        ``50 + 20 %`` of its rows (rows a VACUUM could not remove yet, because an older snapshot
        still sees them, are not counted again).

        One statement reads every table's counters (one transaction per call when there is
        nothing to do). ``SKIP_LOCKED``: a table another replica is working on is left to it.
        """
        if self.dialect != "postgresql":
            return [], []
        async with self.engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            rows = (
                await connection.execute(
                    text(
                        "SELECT current_setting('autovacuum'), s.relname, s.n_dead_tup,"
                        " 50 + 0.2 * greatest(c.reltuples, 0),"
                        " s.n_mod_since_analyze > 50 + 0.1 * greatest(c.reltuples, 0)"
                        " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
                        " WHERE s.schemaname = current_schema() ORDER BY s.relname"
                    )
                )
            ).all()
            if not rows or rows[0][0] == "on":
                return [], []
            left = self._dead_rows_left
            dead = [r[1] for r in rows if vacuum and r[2] - left.get(r[1], 0) > r[3]]
            stale = [r[1] for r in rows if analyze and r[4]]
            quote = self.engine.dialect.identifier_preparer.quote
            for table in dead:
                await connection.execute(text(f"VACUUM (SKIP_LOCKED) {quote(table)}"))
            for table in stale:
                await connection.execute(text(f"ANALYZE (SKIP_LOCKED) {quote(table)}"))
            if dead:
                after = await connection.execute(
                    text("SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = current_schema()")
                )
                left.update({table: count for table, count in after.all() if table in dead})
        return dead, stale

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - any failure means "not serving"
            return False

    async def dispose(self) -> None:
        await self.engine.dispose()
