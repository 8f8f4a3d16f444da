"""`effect-ledger verify` walks every run's hash chain and names the first event that does not match."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid

import psycopg
import pytest

from support import (
    PG_ADMIN_URL,
    ServerProcess,
    authorize_request,
    contract,
    create_pg_database,
    drop_pg_database,
    migrate,
    new_run,
    new_tenant,
    psycopg_url,
    succeeded,
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def filled_ledger(request):
    """A database filled through a real server, once per backend: each test verifies (and edits)
    a copy of its own, the same as filling one per test, without a server start per test."""
    if request.param == "postgres":
        url = create_pg_database("el_verify")
    else:
        url = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='el-verify-'), 'ledger.db')}"
    migrate(url)
    server = ServerProcess(url).start()
    tenant = new_tenant(url)
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    for key in ("k1", "k2"):
        allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, key, target=f"mailto:{key}@example.com"))
        agent.gate.RecordOutcome(succeeded(allowed.attempt_id))
    admin.close()
    agent.close()
    server.stop()
    yield url, run_id
    if request.param == "postgres":
        drop_pg_database(url)


@pytest.fixture
def ledger(filled_ledger):
    """A database of its own (verify reads every run): a copy of the backend's filled one."""
    template, run_id = filled_ledger
    if template.startswith("sqlite"):
        url = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='el-verify-'), 'ledger.db')}"
        with (
            contextlib.closing(sqlite3.connect(template.removeprefix("sqlite:///"))) as source,
            contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as copy,
        ):
            source.backup(copy)
        yield url, run_id
        return
    base, template_name = template.rsplit("/", 1)
    name = f"el_verify_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        # Nothing may be connected to a template while it is copied (the filling process's own
        # pooled connections included).
        connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (template_name,),
        )
        connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    url = f"{base}/{name}"
    yield url, run_id
    drop_pg_database(url)


def verify(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", "verify", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def execute(url: str, statement: str, *parameters) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            connection.execute(statement.replace("%s", "?"), parameters)
    else:
        with psycopg.connect(psycopg_url(url), autocommit=True) as connection:
            connection.execute(statement, parameters)


def test_an_intact_ledger_verifies(ledger):
    url, _ = ledger
    result = verify(url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verifies" in result.stdout


def test_an_edited_event_is_named(ledger):
    url, run_id = ledger
    execute(url, "UPDATE run_events SET payload = %s WHERE run_id = %s AND revision = 3", '{"edited":true}', run_id)
    result = verify(url)
    assert result.returncode == 1
    assert f"run {run_id} revision 3: content does not match its hash" in result.stdout


def test_a_deleted_event_is_named(ledger):
    url, run_id = ledger
    execute(url, "DELETE FROM run_events WHERE run_id = %s AND revision = 2", run_id)
    result = verify(url)
    assert result.returncode == 1 and f"run {run_id} revision 2: revision 2 missing" in result.stdout


def test_reordered_events_are_named(ledger):
    url, run_id = ledger
    execute(url, "UPDATE run_events SET revision = -1 WHERE run_id = %s AND revision = 2", run_id)
    execute(url, "UPDATE run_events SET revision = 2 WHERE run_id = %s AND revision = 3", run_id)
    execute(url, "UPDATE run_events SET revision = 3 WHERE run_id = %s AND revision = -1", run_id)
    result = verify(url)
    assert result.returncode == 1 and f"run {run_id} revision 2: prev_hash does not match" in result.stdout


def test_a_truncated_tail_is_named(ledger):
    url, run_id = ledger
    execute(
        url,
        "DELETE FROM run_events WHERE run_id = %s AND revision = (SELECT MAX(revision) FROM run_events WHERE run_id = %s)",
        run_id,
        run_id,
    )
    result = verify(url)
    assert result.returncode == 1 and "the chain ends at" in result.stdout
