"""The Rego tests beside the shipped policy pass, and the runner reports a failing one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from effect_ledger.policy.rego_tests import run_policy_tests

REPO = Path(__file__).resolve().parents[2]
POLICY_DIR = REPO / "policy"

PLANTED = """package effectledger.planted_test

import rego.v1

import data.effectledger.gate

test_planted_passes if {
	gate.decision.outcome == "DENY" with input as {}
}

test_planted_allows_an_empty_input if {
	gate.decision.outcome == "ALLOW" with input as {}
}

test_planted_crashes if {
	to_number("not a number") == 1
}
"""


ENGINES = ["embedded", "opa"]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_shipped_rego_test_passes(engine):
    results = run_policy_tests(POLICY_DIR, engine)
    failed = [f"{r.file}::{r.name}: {r.detail}" for r in results if not r.passed]
    assert failed == []
    assert len(results) >= 10
    assert len({(r.file, r.name) for r in results}) == len(results)
    assert {r.file for r in results} == {
        "effectledger/gate/gate_test.rego",
        "effectledger/reconcile/reconcile_test.rego",
    }


@pytest.fixture
def planted_copy(tmp_path) -> Path:
    copy = tmp_path / "policy"
    shutil.copytree(POLICY_DIR, copy)
    (copy / "effectledger" / "planted_test.rego").write_text(PLANTED)
    return copy


@pytest.mark.parametrize("engine", ENGINES)
def test_a_planted_failing_test_is_reported_as_failed(planted_copy, engine):
    results = {(r.file, r.name): r for r in run_policy_tests(planted_copy, engine)}
    planted = {name: result for (file, name), result in results.items() if file == "effectledger/planted_test.rego"}
    assert set(planted) == {
        "test_planted_passes",
        "test_planted_allows_an_empty_input",
        "test_planted_crashes",
    }
    assert planted["test_planted_passes"].passed
    assert not planted["test_planted_allows_an_empty_input"].passed
    assert planted["test_planted_allows_an_empty_input"].detail
    assert not planted["test_planted_crashes"].passed
    shipped = [r for (file, _), r in results.items() if file != "effectledger/planted_test.rego"]
    assert shipped and all(r.passed for r in shipped)
