"""How long `effect-ledger serve` takes to start: from launching it to its port file appearing.

    .venv/bin/python bench/start_time.py                 # 5 runs of each way to start
    .venv/bin/python bench/start_time.py --runs 10 --ways serve.sh,workers-2

The ways to start (``--ways``, each measured ``--runs`` times after one start that is not
counted):

- ``serve.sh``: ``bash scripts/serve.sh`` once installed (its defaults: one process). It runs
  from a temporary copy of itself beside copies of pyproject.toml and setup.py, whose ``.venv``
  holds links to the environment running this benchmark (``bin/python``, ``bin/effect-ledger``)
  and a current install stamp: serve.sh does what it does on every start once installed (hash
  the two files, exec the server), and never installs into the checkout's ``.venv``;
- ``workers-1``: ``effect-ledger serve --workers 1``, the server without a supervisor;
- ``workers-2``: ``effect-ledger serve --workers 2``, a supervisor and two workers; the port
  file appears once both serve.

Every start serves ``127.0.0.1:0`` on one SQLite database per way, migrated by the uncounted
first start (so each counted start is a restart: migrations are checked, none applied), and
is stopped with SIGTERM once its port file appears. Prints the median and the maximum of each
way. Other load on the machine adds to every number: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("serve.sh", "workers-1", "workers-2")
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
POLL_SECONDS = 0.005


def _effect_ledger() -> list[str]:
    """The installed command beside this interpreter, or the package run as a module."""
    script = Path(sys.executable).parent / "effect-ledger"
    return [str(script)] if script.exists() else [sys.executable, "-m", "effect_ledger"]


def _serve_sh_copy(folder: Path) -> Path:
    """scripts/serve.sh in ``folder`` as in an installed checkout whose .venv is this one."""
    (folder / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "serve.sh", folder / "scripts" / "serve.sh")
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, folder / name)
    bin_folder = folder / ".venv" / "bin"
    bin_folder.mkdir(parents=True)
    (bin_folder / "python").symlink_to(sys.executable)
    command = _effect_ledger()
    if len(command) == 1:
        (bin_folder / "effect-ledger").symlink_to(command[0])
    else:  # no installed script: a wrapper that runs the module
        wrapper = bin_folder / "effect-ledger"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m effect_ledger "$@"\n')
        wrapper.chmod(0o755)
    # The stamp serve.sh writes after it installs: the hash of pyproject.toml and setup.py.
    digest = subprocess.run(
        "cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1",
        shell=True,
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (folder / ".venv" / ".effect-ledger-installed").write_text(digest)
    return folder / "scripts" / "serve.sh"


def _command(way: str, folder: Path) -> list[str]:
    if way == "serve.sh":
        return ["bash", str(_serve_sh_copy(folder))]
    return [*_effect_ledger(), "serve", "--workers", way.removeprefix("workers-")]


def _start_once(command: list[str], database_url: str, folder: Path) -> float:
    """Seconds from launching ``command`` to its port file appearing; the server is stopped."""
    port_file = folder / "port"
    port_file.unlink(missing_ok=True)
    log = folder / "server.log"
    arguments = ["--database-url", database_url, "--listen", "127.0.0.1:0", "--port-file", str(port_file)]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    with log.open("ab") as output:
        started = time.monotonic()
        process = subprocess.Popen(
            [*command, *arguments, "--grace-seconds", "1"],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=environment,
        )
        try:
            while not (port_file.exists() and port_file.read_text().strip()):
                if process.poll() is not None:
                    raise SystemExit(f"{command} exited with {process.returncode}; see {log}")
                if time.monotonic() - started > START_TIMEOUT_SECONDS:
                    raise SystemExit(f"{command} did not write its port file in {START_TIMEOUT_SECONDS:g} s")
                time.sleep(POLL_SECONDS)
            elapsed = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return elapsed


def measure(way: str, runs: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="el-start-") as name:
        folder = Path(name)
        command = _command(way, folder)
        database_url = f"sqlite:///{folder / 'ledger.db'}"
        _start_once(command, database_url, folder)  # installs nothing; migrates the new database
        return [_start_once(command, database_url, folder) for _ in range(runs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="counted starts of each way (default 5)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    options = parser.parse_args()
    ways = [way for way in options.ways.split(",") if way]
    if options.runs < 1 or not ways or set(ways) - set(WAYS):
        parser.error(f"--runs must be at least 1 and --ways a list of {', '.join(WAYS)}")
    print(f"{'way':<12} {'runs':>4} {'median s':>9} {'max s':>7}   (launch -> port file; {os.cpu_count()} CPUs)")
    for way in ways:
        seconds = measure(way, options.runs)
        print(f"{way:<12} {len(seconds):>4} {statistics.median(seconds):>9.2f} {max(seconds):>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
