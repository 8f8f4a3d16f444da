"""The shipped policy decides the same on the embedded engine and on OPA's own Go engine.

Deployments run real OPA (deploy/); the server's default is the embedded engine. Generated
inputs (hypothesis) cover the facts the policy reads: roles, contracts, verdicts, worlds,
resumes, unknown effects on the target, budgets, approvals, and inputs with facts removed or
given the wrong type. Every input must get the same decision from both engines, and no input
missing a fact may be allowed.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effect_ledger.policy.rego_tests import rule_evaluator

POLICY_DIR = Path(__file__).resolve().parents[2] / "policy"
DECISION = "data.effectledger.gate.decision"
RELIED_ON = (
    "now",
    "principal",
    "run",
    "request",
    "contract",
    "effect",
    "ledger",
    "target_unknown_effects",
    "budgets",
    "approvals",
)

pytest.importorskip("opa_bindings", reason="OPA's engine (opa-golib-python-bindings) is installed by scripts/test.sh")

ENGINES = {name: rule_evaluator(POLICY_DIR, name) for name in ("embedded", "opa")}

names = st.sampled_from(["email.send", "payment.wire", "db.drop"])
ids = st.sampled_from(["a", "b", "c"])

# The strategies below are built once, here, rather than inside the composites on every draw:
# building (and validating) them anew took most of the test's time. They are the same
# strategies, drawn in the same order, so the inputs are drawn exactly as before.
effect_classes = st.sampled_from(["READ_ONLY", "IDEMPOTENT", "RETRYABLE_WITH_KEY", "COMPENSATABLE", "IRREVERSIBLE"])
recoveries = st.lists(st.sampled_from(["RETRY_SAME_KEY", "QUERY_THEN_RETRY", "MANUAL_ONLY"]), unique=True)
mostly_false = st.sampled_from([False, False, True])
approval_states = st.sampled_from(["PENDING", "APPROVED", "DENIED", "CONSUMED", "EXPIRED", "REVOKED"])
approvers = st.lists(st.sampled_from(["rev-1", "rev-2"]), unique=True)
denied_by = st.sampled_from([None, "rev-1"])
binding_problems = st.lists(st.sampled_from(["APPROVAL_USED", "APPROVAL_EXPIRED", "APPROVED_BY_EXECUTOR"]), max_size=1)
verdicts = st.sampled_from(["NEW_EFFECT", "NEW_ATTEMPT", "DUPLICATE", "RECONCILE_REQUIRED", "RETRY_LIMIT_EXCEEDED"])
nows = st.sampled_from(["2026-11-29T12:00:00.000000Z", "2026-11-29T12:00:00Z", "yesterday", ""])
role_lists = st.lists(st.sampled_from(["agent", "admin", "auditor", "reviewer", "operator"]), unique=True)
worlds = st.sampled_from(["LIVE", "SIMULATED"])
pending_lists = st.lists(st.sampled_from(["eff_a", "eff_b"]), unique=True)
# The dicts and lists these two hand out are shared between draws: each input is deep-copied
# (in ``inputs``) before the engines see it, as each draw used to build them afresh.
effects = st.sampled_from([None, {"effect_id": "eff_a", "run_id": "run_1", "stage": "UNKNOWN"}])
ledger_reasons = st.sampled_from([[], [{"code": "RETRY_SAME_KEY", "message": "m"}]])
target_unknown_lists = st.lists(st.just({"effect_id": "eff_x", "run_id": "run_2", "idempotency_key": "x"}), max_size=1)


@st.composite
def contracts(draw):
    if draw(st.booleans()) and draw(st.booleans()):
        return None
    return {
        "tool": draw(names),
        "revision": draw(st.integers(1, 3)),
        "effect_class": draw(effect_classes),
        "provider_idempotency": draw(st.booleans()),
        "queryable": draw(st.booleans()),
        "allowed_recovery": draw(recoveries),
        "has_arguments_schema": False,
        "max_attempts": 3,
        "lease_seconds": 60,
        "retired": draw(mostly_false),
        "simulator": draw(mostly_false),
        "default_estimate": {},
    }


contract_values = contracts()


@st.composite
def approvals(draw):
    return {
        "approval_id": "apr_" + draw(ids),
        "state": draw(approval_states),
        "reusable": draw(st.booleans()),
        "quorum": draw(st.integers(1, 2)),
        "valid_approvers": draw(approvers),
        "denied_by": draw(denied_by),
        "requested_by": "agent-1",
        "binding_problems": draw(binding_problems),
    }


@st.composite
def budgets(draw):
    available = draw(st.integers(0, 100))
    return {
        "budget_id": "bud_" + draw(ids),
        "scope": "TENANT",
        "scope_id": "",
        "dimension": "usd_micros",
        "limit": 100,
        "posted": 100 - available,
        "pending": 0,
        "available": available,
        "estimate": draw(st.integers(0, 120)),
    }


budget_lists = st.lists(budgets(), max_size=2)
approval_lists = st.lists(approvals(), max_size=2)


@st.composite
def well_formed_inputs(draw):
    verdict = draw(verdicts)
    return {
        "version": 1,
        "now": draw(nows),
        "principal": {
            "id": "agent-1",
            "tenant": "acme",
            "roles": draw(role_lists),
        },
        "run": {
            "id": "run_1",
            "created_by": "agent-1",
            "revision": 4,
            "labels": {},
            "world": draw(worlds),
            "segment": 1,
            "parent_run_id": "",
            "pending_reconciliation": draw(pending_lists),
        },
        "request": {
            "tool": draw(names),
            "target": "t",
            "idempotency_key": "k",
            "intent_digest": "d",
            "arguments": {},
            "estimate": {},
        },
        "contract": draw(contract_values),
        "pinned_contract": None,
        "effect": draw(effects),
        "ledger": {
            "verdict": verdict,
            "creates_attempt": verdict in ("NEW_EFFECT", "NEW_ATTEMPT"),
            "reasons": draw(ledger_reasons),
        },
        "run_open_effects": [],
        "run_open_effects_truncated": False,
        "target_unknown_effects": draw(target_unknown_lists),
        "estimate": {},
        "budgets": draw(budget_lists),
        "approvals": draw(approval_lists),
    }


well_formed = well_formed_inputs()


WRONG_TYPES = [None, 1, "x", [], {}, True]
damages = st.sampled_from(["none", "none", "remove", "mistype", "remove_nested"])
relied_on = st.sampled_from(RELIED_ON)
nested_facts = st.sampled_from(
    [
        ("principal", "roles"),
        ("run", "world"),
        ("run", "pending_reconciliation"),
        ("request", "tool"),
        ("ledger", "verdict"),
        ("ledger", "creates_attempt"),
        ("ledger", "reasons"),
    ]
)
_wrong_types: dict[tuple[type, ...], st.SearchStrategy] = {}


def wrong_types(allowed: tuple[type, ...]) -> st.SearchStrategy:
    """The values of WRONG_TYPES that are none of ``allowed`` (one strategy per ``allowed``)."""
    if allowed not in _wrong_types:
        _wrong_types[allowed] = st.sampled_from([w for w in WRONG_TYPES if not isinstance(w, allowed)])
    return _wrong_types[allowed]


@st.composite
def inputs(draw):
    value = copy.deepcopy(draw(well_formed))
    damage = draw(damages)
    if damage == "remove":
        value.pop(draw(relied_on))
    elif damage == "mistype":
        key = draw(relied_on)
        allowed = (type(None), dict) if key in ("contract", "effect") else (type(value[key]),)
        value[key] = draw(wrong_types(allowed))
    elif damage == "remove_nested":
        section, key = draw(nested_facts)
        value[section] = {k: v for k, v in value[section].items() if k != key}
    return damage, value


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_both_engines_decide_the_same(case):
    damage, value = case
    embedded = ENGINES["embedded"](DECISION, value)
    opa = ENGINES["opa"](DECISION, value)
    assert embedded == opa, (damage, value)
    if damage != "none":
        assert embedded["outcome"] == "DENY", (damage, value, embedded)
