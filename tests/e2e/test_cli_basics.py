"""The command line at its edges: --version, serve --help, bad environment values, a port in
use, concurrent `migrate` jobs and `serve --no-migrate`; every case a real process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import psycopg
import pytest

from effect_ledger import __version__
from effect_ledger.storage.migrate import head_revision
from support import REPO, ServerProcess, create_pg_database, drop_pg_database, psycopg_url

COMMAND_TIMEOUT_SECONDS = 60
CONCURRENT_MIGRATIONS = 6


def effect_ledger(*arguments: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", *arguments],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("effect-ledger:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_version():
    result = effect_ledger("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"effect-ledger {__version__}"


def test_serve_help_shows_defaults_and_environment_variables():
    result = effect_ledger("serve", "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps long help
    for flag in ("--listen", "--grace-seconds", "--workers", "--no-migrate", "--opa-url", "--snapshots-per-tenant-max"):
        variable = "EFFECT_LEDGER_" + flag[2:].upper().replace("-", "_")
        assert f"(env {variable})" in text, flag
    assert "(default: 127.0.0.1:50051)" in text
    assert "(default: 10.0)" in text  # --grace-seconds
    assert "--worker-index" not in text  # the supervisor's flags stay hidden


@pytest.mark.parametrize("command", [["verify"], ["serve"]])
def test_a_bad_environment_value_is_one_line_and_exit_2(command, tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = effect_ledger(*command, "--database-url", url, env={"EFFECT_LEDGER_GRACE_SECONDS": "10s"})
    assert_one_line_error(result, "EFFECT_LEDGER_GRACE_SECONDS", "'10s'", "--grace-seconds")


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = effect_ledger(
            "serve",
            "--database-url",
            f"sqlite:///{tmp_path}/ledger.db",
            "--listen",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        )
    assert_one_line_error(result, f"127.0.0.1:{port}", "already in use")


@pytest.mark.postgres
def test_concurrent_migrate_jobs_all_succeed():
    url = create_pg_database("el_cli_migrate")
    try:
        jobs = [
            subprocess.Popen(
                [sys.executable, "-m", "effect_ledger", "migrate", "--database-url", url],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO,
            )
            for _ in range(CONCURRENT_MIGRATIONS)
        ]
        outputs = [job.communicate(timeout=COMMAND_TIMEOUT_SECONDS)[0] for job in jobs]
        assert [job.returncode for job in jobs] == [0] * CONCURRENT_MIGRATIONS, outputs
        with psycopg.connect(psycopg_url(url)) as connection:
            versions = [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
        assert versions == [head_revision()]
    finally:
        drop_pg_database(url)


@pytest.mark.postgres
def test_serve_no_migrate_refuses_an_empty_database_then_serves_a_migrated_one():
    url = create_pg_database("el_cli_no_migrate")
    try:
        for how in (["--no-migrate"], []):
            env = {} if how else {"EFFECT_LEDGER_NO_MIGRATE": "1"}
            started = time.monotonic()
            result = effect_ledger("serve", "--database-url", url, "--listen", "127.0.0.1:0", *how, env=env)
            assert time.monotonic() - started < COMMAND_TIMEOUT_SECONDS
            assert_one_line_error(result, "--no-migrate", "effect-ledger migrate")
            assert re.search(r"newest \(\w+\)", result.stderr), result.stderr
        with psycopg.connect(psycopg_url(url)) as connection:  # nothing was migrated
            assert connection.execute("SELECT to_regclass('alembic_version')").fetchone()[0] is None
        assert effect_ledger("migrate", "--database-url", url).returncode == 0
        server = ServerProcess(url, ["--no-migrate"]).start()
        server.stop()
        assert server.process.returncode == 0, server.log()
    finally:
        drop_pg_database(url)
