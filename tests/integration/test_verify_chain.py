"""`effect-ledger verify` walks every run's hash chain and names the first event that does not match."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile

import psycopg
import pytest

from support import (
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


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request):
    """A database of its own (verify reads every run), filled through a real server."""
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
    server.stop()
    yield url, run_id
    if request.param == "postgres":
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
