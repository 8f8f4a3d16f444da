"""`pip install ./clients/python` in a fresh virtual environment: at most six distributions, and
the README's worked example runs with that environment's interpreter against a real server.

Uses pip's cache (and PyPI, when the cache lacks a wheel); a copy of clients/python is installed,
so the build leaves nothing in the working tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from effect_ledger_client import Ledger
from effect_ledger_client.proto import common_pb2, runs_pb2

from .test_readme_example import README, effects_of_run, python_blocks

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
DISTRIBUTIONS_MAX = 6
STEP_TIMEOUT_SECONDS = 300
ISOLATING = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV"})

# The session's SQLite server only: this is about the installation, not the backends.
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def run(command: list[str], cwd: Path, **environment: str) -> subprocess.CompletedProcess:
    # pip's settings and proxies pass; nothing that points Python into the repository or its venv.
    passed = {name: value for name, value in os.environ.items() if name not in ISOLATING}
    completed = subprocess.run(
        command,
        cwd=cwd,
        env={**passed, **environment},
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_SECONDS,
        check=False,
    )
    assert completed.returncode == 0, f"{command}:\n{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}"
    return completed


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, list[str]]:
    """A fresh venv with the client installed: (its interpreter, the distributions pip installed)."""
    folder = tmp_path_factory.mktemp("install")
    source = folder / "python"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    run([sys.executable, "-m", "venv", str(folder / "venv")], folder)
    python = folder / "venv" / "bin" / "python"
    report = folder / "report.json"
    run([str(python), "-m", "pip", "install", "--quiet", "--report", str(report), str(source)], folder)
    names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    return python, names


def test_the_client_installs_at_most_six_distributions(installed):
    python, names = installed
    assert len(names) <= DISTRIBUTIONS_MAX, f"{len(names)} distributions: {', '.join(sorted(names))}"
    assert "effect-ledger-client" in names
    # The client alone: the server's package does not come along.
    probe = run(
        [
            str(python),
            "-c",
            "import effect_ledger_client, importlib.util as u; "
            "print(effect_ledger_client.__file__, u.find_spec('effect_ledger'), u.find_spec('effectledger'))",
        ],
        python.parent,
    )
    location, server_package, server_stubs = probe.stdout.split()
    assert location.startswith(str(python.parent.parent)) and server_package == server_stubs == "None"


@SQLITE_ONLY
def test_the_readme_example_runs_with_the_installed_client(installed, server, tenant, tmp_path):
    python, _ = installed
    admin_block, agent_block = python_blocks(README, "A worked example")
    tenant.add("ops", "admin")
    tenant.add("mailer-agent", "agent")
    request_id = f"ticket-4711-{tenant.name}"
    swaps = {
        "127.0.0.1:50051": server.target,
        "elt_...ops token...": tenant.tokens["ops"],
        "elt_...mailer-agent token...": tenant.tokens["mailer-agent"],
        'request_id="ticket-4711"': f'request_id="{request_id}"',
    }
    for name, block in (("admin.py", admin_block), ("agent.py", agent_block)):
        for old, new in swaps.items():
            block = block.replace(old, new)
        (tmp_path / name).write_text(block)
    run([str(python), "admin.py"], tmp_path)
    first = run([str(python), "agent.py"], tmp_path).stdout
    again = run([str(python), "agent.py"], tmp_path).stdout  # a new process, the same run and key
    assert first.strip() == again.strip() == "msg-8841"

    token = tenant.tokens["mailer-agent"]
    with Ledger(server.target, token) as agent:
        run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest(request_id=request_id)).run_id
    (effect,) = effects_of_run(server, token, run_id)
    assert common_pb2.Stage.Name(effect.stage) == "SUCCEEDED" and len(effect.attempts) == 1
