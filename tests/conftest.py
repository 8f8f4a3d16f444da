"""Fixtures: a real PostgreSQL database and a SQLite file, migrated; a real server per backend.

PostgreSQL is required (CI starts it); set EFFECT_LEDGER_TEST_PG_URL to point elsewhere.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import (
    FUZZ_SEED_ENV,
    ServerProcess,
    create_pg_database,
    drop_pg_database,
    fuzz_seed,
    migrate,
    new_tenant,
)

BACKENDS = ["sqlite", "postgres"]


def pytest_configure(config):
    """Chooses the fuzzer's seed once, before pytest-xdist starts its workers (they inherit it)."""
    fuzz_seed()


def pytest_report_header(config):
    """The fuzzer's seed, shown even when output is captured (as it is under pytest-xdist)."""
    seed = fuzz_seed()
    return f"fuzz seed {seed} (tests/e2e/test_fuzz.py): {FUZZ_SEED_ENV}={seed} replays it"


@pytest.fixture(scope="session")
def pg_url():
    url = create_pg_database()
    migrate(url)
    yield url
    drop_pg_database(url)


@pytest.fixture(scope="session")
def sqlite_url():
    folder = tempfile.mkdtemp(prefix="el-sqlite-")
    url = f"sqlite:///{os.path.join(folder, 'ledger.db')}"
    migrate(url)
    return url


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def database_url(backend, request) -> str:
    return request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url")


_servers: dict[str, ServerProcess] = {}


@pytest.fixture(scope="session")
def server(database_url):
    """One server process per backend for the whole session (tests isolate by tenant)."""
    running = _servers.get(database_url)
    if running is None or running.process is None or running.process.poll() is not None:
        running = ServerProcess(database_url, ["--lease-sweep-interval-seconds", "0.2"]).start()
        _servers[database_url] = running
    yield running


def pytest_sessionfinish(session, exitstatus):
    for running in _servers.values():
        running.stop()


@pytest.fixture
def tenant(database_url):
    return new_tenant(database_url)


def _role_client(server, tenant, principal_id):
    client = tenant.client(server, principal_id)
    yield client
    client.close()


@pytest.fixture
def agent(server, tenant):
    """The tenant's agent, over a real channel to the backend's server."""
    yield from _role_client(server, tenant, "agent")


@pytest.fixture
def admin(server, tenant):
    yield from _role_client(server, tenant, "admin")


@pytest.fixture
def reviewer(server, tenant):
    yield from _role_client(server, tenant, "reviewer")


@pytest.fixture
def operator(server, tenant):
    """The tenant's operator: settles what agents left uncertain."""
    tenant.add("operator", "operator")
    yield from _role_client(server, tenant, "operator")
