"""`principal add` and `principal set-roles` warn when one principal both executes and approves."""

from __future__ import annotations

import subprocess
import sys


def _principal(tmp_path, command: str, principal_id: str, *roles: str) -> subprocess.CompletedProcess[str]:
    arguments = [sys.executable, "-m", "effect_ledger", "principal", command]
    arguments += ["--database-url", f"sqlite:///{tmp_path / 'ledger.db'}", "--tenant", "t", "--id", principal_id]
    for role in roles:
        arguments += ["--role", role]
    return subprocess.run(arguments, capture_output=True, text=True, timeout=60, check=True)


def test_agent_and_reviewer_in_one_principal_is_warned_about(tmp_path):
    dual = _principal(tmp_path, "add", "dual", "agent", "reviewer")
    assert "warning" in dual.stderr and "four eyes" in dual.stderr
    assert dual.stdout.startswith("elt_")  # the principal is still created

    plain = _principal(tmp_path, "add", "agent-1", "agent")
    assert "warning" not in plain.stderr
    operator = _principal(tmp_path, "add", "ops", "operator")
    assert "warning" not in operator.stderr

    changed = _principal(tmp_path, "set-roles", "agent-1", "agent", "reviewer")
    assert "warning" in changed.stderr and "four eyes" in changed.stderr
