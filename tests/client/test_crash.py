"""An agent process killed (SIGKILL) while its guarded body runs, after the dispatch, or ended by
an exception its body raised after the dispatch: a new process guarding the same key must not run
the body again. The attempt started DISPATCHED: when the killed process's lease runs out, or at
once when the guard reports the exception, the effect is UNKNOWN and the guard raises
ReconcileRequired.

Real processes, a real server per backend. The tool's contract lists no RETRY_SAME_KEY recovery:
with it, a new attempt under the same provider key would be allowed on purpose."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from effect_ledger_client import Ledger
from effect_ledger_client.proto import common_pb2, gate_pb2, runs_pb2

from .conftest import register

LEASE_SECONDS = 2
AGENT = r"""
import json, sys, time
from pathlib import Path
from effect_ledger_client import Ledger, ReconcileRequired

target, token, run_id, key, folder, ending = sys.argv[1:7]
folder = Path(folder)
with Ledger(target, token) as ledger:
    try:
        with ledger.guard(run_id, "email.send", {"to": "bob@example.com"}, key=key) as effect:
            runs = folder / "body-runs"
            runs.write_text(runs.read_text() + "run\n" if runs.exists() else "run\n")
            (folder / "in-body").write_text(effect.effect_id)
            if ending == "raise":  # the provider call failed after sending: the process dies of it
                raise ConnectionResetError("connection reset after the request was sent")
            time.sleep(120)  # "sending": killed here
            effect.succeeded("msg-1")
    except ReconcileRequired as required:
        print(json.dumps({"reconcile_required": required.effect_id, "stage": required.stage}))
"""


def start_agent(
    script: Path, server, token: str, run_id: str, key: str, folder: Path, ending: str = "sleep"
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), server.target, token, run_id, key, str(folder), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate, timeout_seconds: float, what: str):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def effect_stage(ledger: Ledger, effect_id: str) -> str:
    effect = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
    return common_pb2.Stage.Name(effect.stage)


def test_a_body_killed_after_dispatch_never_runs_again(server, tenant, admin_ledger, tmp_path):
    register(admin_ledger, lease_seconds=LEASE_SECONDS)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    token = tenant.tokens["agent"]
    with Ledger(server.target, token) as ledger:
        run_id = ledger.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        first = start_agent(script, server, token, run_id, "crash-1", tmp_path)
        try:
            effect_id = wait_for(
                lambda: (tmp_path / "in-body").exists() and (tmp_path / "in-body").read_text(), 30, "the body to start"
            )
            assert effect_stage(ledger, effect_id) == "DISPATCHED"
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        assert first.returncode == -signal.SIGKILL

        # Nobody renews the lease any more: the effect becomes UNKNOWN (it may have been sent).
        wait_for(lambda: effect_stage(ledger, effect_id) == "UNKNOWN", LEASE_SECONDS + 10, "the lease to run out")

        second = start_agent(script, server, token, run_id, "crash-1", tmp_path)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert json.loads(out) == {"reconcile_required": effect_id, "stage": "UNKNOWN"}
        assert (tmp_path / "body-runs").read_text() == "run\n"  # the body ran once, in the killed process
        stored = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
        assert len(stored.attempts) == 1 and common_pb2.Stage.Name(stored.stage) == "UNKNOWN"


def test_a_body_that_raises_after_dispatch_ends_its_process_and_never_runs_again(
    server, tenant, admin_ledger, tmp_path
):
    """The body raises (a reset connection after sending) and the process exits with that
    exception: the guard recorded UNKNOWN on the way out, so a restarted process with the same key
    gets ReconcileRequired at once, and the body ran once in all."""
    register(admin_ledger)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    token = tenant.tokens["agent"]
    with Ledger(server.target, token) as ledger:
        run_id = ledger.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        first = start_agent(script, server, token, run_id, "raise-1", tmp_path, ending="raise")
        _, err = first.communicate(timeout=60)
        assert first.returncode == 1 and "ConnectionResetError: connection reset after the request" in err, err
        effect_id = (tmp_path / "in-body").read_text()
        assert effect_stage(ledger, effect_id) == "UNKNOWN"  # recorded before the process ended

        second = start_agent(script, server, token, run_id, "raise-1", tmp_path, ending="raise")
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert json.loads(out) == {"reconcile_required": effect_id, "stage": "UNKNOWN"}
        assert (tmp_path / "body-runs").read_text() == "run\n"
        stored = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
        assert len(stored.attempts) == 1 and common_pb2.Stage.Name(stored.attempts[0].stage) == "UNKNOWN"
