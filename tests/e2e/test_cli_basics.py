"""The command line at its edges: --version, every command's --help, bad environment values, a
port in use (one worker or several), `console`, concurrent `migrate` jobs and
`serve --no-migrate`; every case a real process but the help texts, read in this one."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time

import psycopg
import pytest

from effect_ledger import __version__
from effect_ledger.cli import build_parser, main
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


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for every command that runs something: serve, principal add, ..."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path, parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from _commands(sub, (*path, name))


COMMANDS = {" ".join(path): sub for path, sub in _commands(build_parser())}
# The flags an EFFECT_LEDGER_ variable sets wherever they appear; serve's own are checked above.
ENVIRONMENT_FLAGS = ("--database-url", "--policy-dir", "--listen", "--grace-seconds", "--log-level", "--log-format")
# Flags no variable sets: their help must not claim one.
COMMAND_LINE_ONLY_FLAGS = ("--tenant", "--id", "--role", "--engine", "--dry-run", "--note")


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"console"}))
def test_every_command_help_shows_defaults_and_names_its_environment_variables(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps long help
    assert text.startswith(f"usage: effect-ledger {command} ")
    flags = {o for a in COMMANDS[command]._actions for o in a.option_strings}
    assert flags & set(ENVIRONMENT_FLAGS) or command == "checkpoint-keys export-public" or flags <= {"-h", "--help"}
    for flag in flags & set(ENVIRONMENT_FLAGS):
        variable = "EFFECT_LEDGER_" + flag[2:].upper().replace("-", "_")
        assert re.search(rf"{flag} \S+ .*\(env {variable}\)", text), (flag, text)
    for flag in flags & set(COMMAND_LINE_ONLY_FLAGS):
        variable = "EFFECT_LEDGER_" + flag[2:].upper().replace("-", "_")
        assert variable not in text, flag
    if "--engine" in flags:
        assert "(default: embedded)" in text


def test_verify_help_in_a_process_names_the_database_variable():
    result = effect_ledger("verify", "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "(env EFFECT_LEDGER_DATABASE_URL)" in " ".join(result.stdout.split())


def test_a_bad_environment_value_is_one_line_and_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = effect_ledger("serve", "--database-url", url, env={"EFFECT_LEDGER_GRACE_SECONDS": "10s"})
    assert_one_line_error(result, "EFFECT_LEDGER_GRACE_SECONDS", "'10s'", "--grace-seconds")


def test_a_bad_serve_variable_stops_neither_version_nor_verify(tmp_path):
    bad = {"EFFECT_LEDGER_GRACE_SECONDS": "10s", "EFFECT_LEDGER_WORKERS": "two"}
    assert effect_ledger("--version", env=bad).stdout.strip() == f"effect-ledger {__version__}"
    url = f"sqlite:///{tmp_path}/ledger.db"
    result = effect_ledger("verify", "--database-url", url, env=bad)
    assert_one_line_error(result, "verify", "effect-ledger migrate")  # not migrated yet: says so
    assert effect_ledger("migrate", "--database-url", url, env=bad).returncode == 0
    result = effect_ledger("verify", "--database-url", url, env=bad)
    assert result.returncode == 0, result.stderr
    assert "every run's hash chain verifies" in result.stdout
    help_text = effect_ledger("serve", "--help", env=bad)
    assert help_text.returncode == 0, help_text.stderr


def test_console_runs_the_client_console_with_the_arguments_after_it():
    result = effect_ledger("console", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: effect-ledger-console")
    for flag in ("--server", "--listen", "--root-certificates", "--secure-cookies"):
        assert flag in result.stdout
    result = effect_ledger("console", "--no-such-flag")
    assert result.returncode == 2 and "unrecognized arguments: --no-such-flag" in result.stderr


@pytest.mark.parametrize("missing", ["uvicorn", "starlette", "effect_ledger_client"])
def test_console_without_its_extra_says_how_to_install_it(missing):
    # The module is blocked in this process only: its import fails as when it is not installed.
    script = f"import sys; sys.modules[{missing!r}] = None; from effect_ledger.cli import main; sys.exit(main())"
    result = subprocess.run(
        [sys.executable, "-c", script, "console", "--help"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        cwd=REPO,
    )
    assert_one_line_error(result, "pip install './clients/python[console]'", f"'{missing}")
    assert result.stdout == ""


@pytest.fixture(scope="module")
def multi_worker_server(tmp_path_factory):
    """Another `serve --workers 2`: its workers share their port through SO_REUSEPORT."""
    folder = tmp_path_factory.mktemp("holder")
    server = ServerProcess(f"sqlite:///{folder}/ledger.db", workers=2).start()
    yield server
    server.stop()


@pytest.mark.parametrize("holder", ["a plain socket", "serve --workers 2"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_is_one_line_and_exit_2(workers, holder, tmp_path, request):
    with socket.socket() as taken:
        if holder == "a plain socket":
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
        else:
            server = request.getfixturevalue("multi_worker_server")
            port = server.port
        result = effect_ledger(
            "serve",
            "--database-url",
            f"sqlite:///{tmp_path}/ledger.db",
            "--listen",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--port-file",
            str(tmp_path / "port"),
        )
    assert_one_line_error(result, f"127.0.0.1:{port}", "already in use")
    assert "worker" not in result.stderr, result.stderr  # stopped before any worker started
    assert not (tmp_path / "port").exists()
    if holder != "a plain socket":
        assert server.process.poll() is None and server.wait_serving(COMMAND_TIMEOUT_SECONDS), server.log()


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
