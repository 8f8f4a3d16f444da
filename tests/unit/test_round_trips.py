"""Database round trips per RPC (storage/round_trips.py), counted on real engines.

One transaction of two statements is four exchanges with the database (BEGIN, two statements,
COMMIT), attributed to the method of the call it ran in; with counting off nothing is hooked
and nothing is counted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from types import SimpleNamespace

import grpc
import pytest
from sqlalchemy import event, text

from effect_ledger.config import Limits
from effect_ledger.storage import round_trips
from effect_ledger.storage.engine import DatabaseSettings, create_async
from effect_ledger.transport.guard import Guard

AUTHORIZE = "/effectledger.v1.Gate/AuthorizeEffect"
PG_URL = os.environ.get("EFFECT_LEDGER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/postgres")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}" if request.param == "sqlite" else PG_URL


@pytest.fixture
def counting(monkeypatch, tmp_path):
    """Counting on, writing under tmp_path; the process-wide setup left to its own test."""
    monkeypatch.setattr(round_trips, "enabled", True)
    monkeypatch.setattr(round_trips, "path", str(tmp_path / "round_trips.json"))
    monkeypatch.setattr(round_trips, "_process_ready", True)
    round_trips.reset()
    yield tmp_path / "round_trips.json"
    round_trips.reset()


@pytest.fixture
def not_counting(monkeypatch, tmp_path):
    monkeypatch.setattr(round_trips, "enabled", False)
    monkeypatch.setattr(round_trips, "path", "")
    round_trips.reset()
    yield
    round_trips.reset()


async def in_call(method: str, work) -> None:
    """Run ``work`` in a task of its own, as gRPC runs a call, attributed to ``method``."""

    async def call() -> None:
        round_trips.begin_call(method)
        await work()

    await asyncio.create_task(call())


async def two_statements_committed(engine) -> None:
    async with engine.connect() as connection, connection.begin():
        await connection.execute(text("SELECT 1"))
        await connection.execute(text("SELECT 2"))


async def one_statement_rolled_back(engine) -> None:
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await connection.execute(text("SELECT 1"))
        await transaction.rollback()


async def test_a_committed_transaction_is_begin_statements_commit(counting, database_url):
    engine = create_async(DatabaseSettings(database_url, pool_size=1))
    try:
        await in_call(AUTHORIZE, lambda: two_statements_committed(engine))
        await in_call(AUTHORIZE, lambda: two_statements_committed(engine))
    finally:
        await engine.dispose()
    assert round_trips.summary() == {AUTHORIZE: {"calls": 2, "round_trips": 8, "per_call": 4.0}}


async def test_a_rollback_is_one_round_trip(counting, database_url):
    engine = create_async(DatabaseSettings(database_url, pool_size=1))
    try:
        await in_call("/effectledger.v1.Runs/GetRun", lambda: one_statement_rolled_back(engine))
    finally:
        await engine.dispose()
    assert round_trips.round_trips == {"/effectledger.v1.Runs/GetRun": 3}


@pytest.mark.postgres
@pytest.mark.parametrize("commits, counted", [(False, 1), (True, 0)])
async def test_the_pools_rollback_counts_only_when_the_driver_left_a_transaction(counting, commits, counted):
    engine = create_async(DatabaseSettings(PG_URL, pool_size=1))

    async def on_the_driver() -> None:
        async with engine.connect() as connection:
            driver = (await connection.get_raw_connection()).driver_connection
            await driver.execute("SELECT 1")  # its own round trips are the caller's to note()
            if commits:
                await driver.commit()

    try:
        await in_call(AUTHORIZE, on_the_driver)
    finally:
        await engine.dispose()
    assert round_trips.round_trips[AUTHORIZE] == counted


async def test_work_outside_a_call_and_noted_trips_are_kept_apart(counting, database_url):
    engine = create_async(DatabaseSettings(database_url, pool_size=1))
    try:
        await asyncio.create_task(two_statements_committed(engine))

        async def fast_path() -> None:
            round_trips.note()  # one pipeline sync
            round_trips.note(2)

        await in_call(AUTHORIZE, fast_path)
    finally:
        await engine.dispose()
    assert round_trips.summary() == {
        round_trips.NO_RPC: {"calls": 0, "round_trips": 4, "per_call": None},
        AUTHORIZE: {"calls": 1, "round_trips": 3, "per_call": 3.0},
    }


async def test_nothing_is_hooked_or_counted_when_off(not_counting, database_url, tmp_path):
    engine = create_async(DatabaseSettings(database_url, pool_size=1))
    try:
        assert not event.contains(engine.sync_engine, "before_cursor_execute", round_trips._count_one)
        await asyncio.create_task(two_statements_committed(engine))
        round_trips.note(5)
    finally:
        await engine.dispose()
    round_trips.write()
    assert not round_trips.round_trips and not round_trips.calls
    assert list(tmp_path.glob("round_trips*")) == []


async def test_the_interceptor_attributes_the_call_to_its_method(counting):
    async def authorize(request, context):
        round_trips.note(7)
        return request

    async def continuation(details):
        return grpc.unary_unary_rpc_method_handler(authorize)

    async def authenticate(token, peer_subject):
        raise AssertionError("the call succeeds: the guard has no reason to authenticate it")

    async def call() -> None:
        guard = Guard(5.0, 8, Limits(), authenticate)
        metadata = (("authorization", "Bearer token"),)
        handler = await guard.intercept_service(
            continuation, SimpleNamespace(method=AUTHORIZE, invocation_metadata=metadata)
        )
        assert (
            await handler.unary_unary(
                b"request", SimpleNamespace(time_remaining=lambda: 4.0, set_trailing_metadata=lambda metadata: None)
            )
            == b"request"
        )

    await asyncio.create_task(call())
    assert round_trips.summary() == {AUTHORIZE: {"calls": 1, "round_trips": 7, "per_call": 7.0}}


def test_counts_are_written_per_process_at_start_and_on_sigusr1(counting, monkeypatch):
    monkeypatch.setattr(round_trips, "_process_ready", False)
    previous = signal.getsignal(signal.SIGUSR1)
    written = counting.with_name(f"{counting.name}.{os.getpid()}")
    try:
        round_trips._prepare_process()
        assert json.loads(written.read_text()) == {}
        round_trips.calls[AUTHORIZE] += 4
        round_trips.round_trips[AUTHORIZE] += 10
        os.kill(os.getpid(), signal.SIGUSR1)
        assert json.loads(written.read_text()) == {AUTHORIZE: {"calls": 4, "round_trips": 10, "per_call": 2.5}}
    finally:
        signal.signal(signal.SIGUSR1, previous)
