"""docs/runbook-unknown-effect.md runs as written: its ```sh blocks, in order, in one bash, with
the environment it documents, against a real server where an agent left an UNKNOWN effect. Once
where the agent reported the outcome unknown and the provider has no record (not happened), once
where the agent went silent until its lease ran out and the provider has it (a receipt)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from effect_ledger_client import Ledger
from effect_ledger_client.proto import common_pb2, gate_pb2, runs_pb2
from support import contract

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "docs" / "runbook-unknown-effect.md"
VENV_BIN = Path(sys.executable).parent
RUNBOOK_SECONDS_MAX = 60
LEASE_LAPSE_WAIT_SECONDS_MAX = 10.0

# The command talks gRPC, whatever the server stores in: these tests use the PostgreSQL server.
postgres_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def sh_blocks(path: Path) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)


def documented_variables(path: Path) -> set[str]:
    return set(re.findall(r"`(EFFECT_LEDGER_[A-Z_]+)`", path.read_text()))


def run_runbook(server, token_file: Path, answers: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = "set -euo pipefail\n" + "\n".join(sh_blocks(RUNBOOK))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    environment.update(
        PATH=f"{VENV_BIN}{os.pathsep}{environment.get('PATH', '')}",
        EFFECT_LEDGER_SERVER=server.target,
        EFFECT_LEDGER_TOKEN_FILE=str(token_file),
        **answers,
    )
    return subprocess.run(
        ["bash", "-c", script],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUNBOOK_SECONDS_MAX,
        check=False,
    )


@pytest.fixture
def operator_token_file(tenant, tmp_path) -> Path:
    path = tmp_path / "operator.token"
    path.write_text(tenant.add("operator", "operator") + "\n")
    return path


def agent_effect(ledger: Ledger, tool: str) -> gate_pb2.AuthorizeEffectResponse:
    """An agent's effect, authorized and sent (begin_dispatched)."""
    run_id = ledger.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    allowed = ledger.gate.AuthorizeEffect(
        gate_pb2.AuthorizeEffectRequest(
            run_id=run_id,
            tool=tool,
            arguments_json=b'{"to":"bob@example.com"}',
            idempotency_key="welcome-bob",
            target="mailto:bob@example.com",
            begin_dispatched=True,
        )
    )
    assert common_pb2.Outcome.Name(allowed.outcome) == "ALLOW"
    return allowed


def stage_of(ledger: Ledger, effect_id: str) -> str:
    return common_pb2.Stage.Name(ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id)).stage)


def test_the_runbook_documents_the_environment_it_uses():
    blocks = sh_blocks(RUNBOOK)
    assert len(blocks) >= 8
    text = "\n".join(blocks)
    for step in ("effects list --stage UNKNOWN", "effects show", "runs trace", "decisions show", "effects reconcile"):
        assert step in text, step
    assert {"EFFECT_LEDGER_SERVER", "EFFECT_LEDGER_TOKEN_FILE", "EFFECT_LEDGER_TOKEN"} <= documented_variables(RUNBOOK)


def test_the_runbook_installs_the_command_from_the_repository():
    # No package index carries the client: the install names its folder in the repository, whose
    # distribution has the ``cli`` extra and the ``effect-ledger-ctl`` script.
    installs = re.findall(r"`(pip install [^`]+)`", RUNBOOK.read_text())
    assert installs == ["pip install './clients/python[cli]'"], installs
    project = tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())["project"]
    assert "cli" in project["optional-dependencies"]
    assert project["scripts"]["effect-ledger-ctl"] == "effect_ledger_client.cli:main"


@postgres_only
def test_an_effect_reported_unknown_is_settled_as_not_happened(
    server, tenant, ledger, admin_ledger, operator_token_file, tmp_path
):
    admin_ledger.tools.PutToolContract(contract("email.send"))
    allowed = agent_effect(ledger, "email.send")
    ledger.gate.RecordOutcome(
        gate_pb2.RecordOutcomeRequest(
            attempt_id=allowed.attempt_id,
            unknown=gate_pb2.RecordOutcomeRequest.Unknown(reason="connection reset after sending"),
        )
    )
    assert stage_of(ledger, allowed.effect_id) == "UNKNOWN"

    answers = {"HAPPENED": "no", "PROVIDER_ANSWER": "no message with that key in the provider log"}
    done = run_runbook(server, operator_token_file, answers, tmp_path)

    assert done.returncode == 0, done.stderr
    assert f"effect: {allowed.effect_id}" in done.stdout and f"{allowed.effect_id} settled" in done.stdout
    assert "attempt.unknown" in done.stdout  # the trace step showed how it got there
    settled = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert common_pb2.Stage.Name(settled.stage) == "FAILED"
    assert (settled.reconciled_by, settled.reconcile_reason) == ("operator", answers["PROVIDER_ANSWER"])


@postgres_only
def test_an_effect_whose_lease_ran_out_is_settled_with_a_receipt(
    server, tenant, ledger, admin_ledger, operator_token_file, tmp_path
):
    admin_ledger.tools.PutToolContract(contract("email.send", lease_seconds=1))
    allowed = agent_effect(ledger, "email.send")  # and the agent goes silent
    deadline = time.monotonic() + LEASE_LAPSE_WAIT_SECONDS_MAX
    while stage_of(ledger, allowed.effect_id) != "UNKNOWN":
        assert time.monotonic() < deadline, "the lease did not run out"
        time.sleep(0.2)

    answers = {"HAPPENED": "yes", "PROVIDER_REFERENCE": "msg-8841"}
    done = run_runbook(server, operator_token_file, answers, tmp_path)

    assert done.returncode == 0, done.stderr
    assert f"{allowed.effect_id} settled" in done.stdout
    settled = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert common_pb2.Stage.Name(settled.stage) == "SUCCEEDED"
    assert settled.receipt.provider_reference == "msg-8841" and settled.reconciled_by == "operator"
