"""Database round trips per RPC, counted in the server while a benchmark runs (off by default).

``EFFECT_LEDGER_ROUND_TRIPS_FILE=<path>`` turns counting on. Unset (always, outside the
benchmark), every hook is absent and ``note`` costs one comparison.

What counts as one round trip is one client-server exchange as the driver does it:

- one per statement a cursor executes (SQLAlchemy's ``before_cursor_execute``); an
  ``executemany`` is one, psycopg sends its rows in one pipeline;
- one per BEGIN (the ``begin`` event): psycopg 3 sends BEGIN as a query of its own before the
  first statement of a transaction. On SQLite the BEGIN IMMEDIATE is a statement the engine
  executes, already counted as one, so the event is not counted twice there;
- one per COMMIT and one per ROLLBACK (``commit``, ``rollback`` events);
- on PostgreSQL, one for the pool's ROLLBACK of a connection returned in a transaction (the
  ``reset`` event, when psycopg reports the connection not idle: it sends nothing otherwise),
  which is where a transaction run on the driver connection itself and not ended goes;
- whatever a hand-written driver path reports with ``note()`` (one per pipeline sync or execute).

Not counted: opening a connection (and the dialect's first queries on it); psycopg's PREPARE
of a statement outside a pipeline, once per statement and connection; and whatever code on the
driver connection itself sends without calling ``note()``. A transaction begun and ended
without a statement is counted as two although psycopg sends nothing; the unit of work never
does that.

Round trips are attributed to the gRPC method in ``current_method``, which the server's
interceptor sets for the whole of each call; the ones made outside any call (the health
monitor's ping, the lease sweeper) go under ``(no RPC)``.

Each server process writes ``<path>.<pid>``: once, empty, when its engine is created (so a
benchmark knows which processes count), again on SIGUSR1 (a snapshot between measured
windows), at graceful shutdown and at exit. The file holds
``{method: {"calls": n, "round_trips": m, "per_call": m / n}}``.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import signal
from collections import Counter
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import PoolResetState

FILE_VARIABLE = "EFFECT_LEDGER_ROUND_TRIPS_FILE"
NO_RPC = "(no RPC)"

path: str = os.environ.get(FILE_VARIABLE, "")
enabled: bool = bool(path)

current_method: contextvars.ContextVar[str] = contextvars.ContextVar("round_trips_method", default="")
calls: Counter[str] = Counter()
round_trips: Counter[str] = Counter()
_process_ready = False


def note(count: int = 1) -> None:
    """Add ``count`` database round trips to the RPC being served."""
    if not enabled:
        return
    round_trips[current_method.get()] += count


def begin_call(method: str) -> None:
    """The interceptor's hook: what follows in this call's task is attributed to ``method``."""
    current_method.set(method)
    calls[method] += 1


def _count_one(*_event_arguments: Any) -> None:
    note()


def _count_reset_rollback(dbapi_connection: Any, _record: Any, reset_state: PoolResetState) -> None:
    # The pool rolls back only when the Connection did not end its transaction itself, and
    # psycopg sends the ROLLBACK only when the connection is in a transaction.
    if reset_state.transaction_was_reset or not reset_state.asyncio_safe:
        return
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    if driver.info.transaction_status != _psycopg_idle():
        note()


def _psycopg_idle() -> Any:
    from psycopg import pq

    return pq.TransactionStatus.IDLE


def install(sync_engine: Engine) -> None:
    """Count this engine's round trips; also makes this process write its counts (see above)."""
    event.listen(sync_engine, "before_cursor_execute", _count_one)
    if sync_engine.dialect.name != "sqlite":
        event.listen(sync_engine, "begin", _count_one)
    event.listen(sync_engine, "commit", _count_one)
    event.listen(sync_engine, "rollback", _count_one)
    if sync_engine.dialect.driver == "psycopg":
        event.listen(sync_engine, "reset", _count_reset_rollback)
    _prepare_process()


def _prepare_process() -> None:
    global _process_ready
    if _process_ready or not enabled:
        return
    _process_ready = True
    atexit.register(write)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    try:
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: write())
    except ValueError:
        pass  # not the main thread: no snapshots on demand, the shutdown write still happens
    write()


def reset() -> None:
    calls.clear()
    round_trips.clear()


def _after_fork_in_child() -> None:
    # A forked child starts from zero (its parent reports its own counts) and says it counts.
    reset()
    write()


def summary() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for method in sorted(set(calls) | set(round_trips)):
        count, trips = calls.get(method, 0), round_trips.get(method, 0)
        result[method or NO_RPC] = {
            "calls": count,
            "round_trips": trips,
            "per_call": round(trips / count, 3) if count else None,
        }
    return result


def write() -> None:
    """Write this process's counts to ``<path>.<pid>`` (replaced whole, never half-written)."""
    if not enabled:
        return
    target = f"{path}.{os.getpid()}"
    with open(target + ".tmp", "w", encoding="utf-8") as file:
        json.dump(summary(), file, indent=1, sort_keys=True)
    os.replace(target + ".tmp", target)
