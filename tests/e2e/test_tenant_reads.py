"""Tenant-wide reads (ListEffects, ListRuns, ListDecisions, ListBudgets) against the real
server, on both backends: filters, complete and stable pages, tenant isolation, refused
filters."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from effectledger.v1 import budgets_pb2, common_pb2, gate_pb2, runs_pb2
from support import (
    authorize_request,
    contract,
    new_run,
    new_tenant,
    raises_error,
    succeeded,
    unknown,
)

PAST = Timestamp(seconds=946_684_800)  # 2000-01-01
FUTURE = Timestamp(seconds=4_102_444_800)  # 2100-01-01


def _all_pages(call, make_request, items: str, page_size: int) -> list:
    found, token = [], ""
    for _ in range(100):
        response = call(make_request(page_size=page_size, page_token=token))
        found.extend(getattr(response, items))
        token = response.next_page_token
        if not token:
            return found
    raise AssertionError("the pages never ended")


@pytest.fixture
def ledger(server, tenant, agent, admin, database_url):
    """Two runs of effects in this tenant, and one effect in another tenant."""
    admin.tools.PutToolContract(contract(lease_seconds=3600))
    admin.tools.PutToolContract(contract("crm.update", lease_seconds=3600))
    run_a, run_b = new_run(agent), new_run(agent)
    a = [agent.gate.AuthorizeEffect(authorize_request(run_a, f"a-{i}")) for i in range(5)]
    b = [
        agent.gate.AuthorizeEffect(authorize_request(run_b, f"b-{i}", tool="crm.update", target=f"crm:{i}"))
        for i in range(2)
    ]
    agent.gate.RecordOutcome(unknown(a[0].attempt_id))
    agent.gate.RecordOutcome(succeeded(a[1].attempt_id))
    other = new_tenant(database_url)
    other_admin, other_agent = other.client(server, "admin"), other.client(server, "agent")
    other_admin.tools.PutToolContract(contract(lease_seconds=3600))
    other_run = new_run(other_agent)
    other_effect = other_agent.gate.AuthorizeEffect(authorize_request(other_run, "a-0"))
    yield {"run_a": run_a, "run_b": run_b, "a": a, "b": b, "other_run": other_run, "other": other_effect}
    other_admin.close()
    other_agent.close()


def test_list_effects_pages_are_complete_stable_and_of_one_tenant(agent, ledger):
    mine = {r.effect_id for r in ledger["a"] + ledger["b"]}
    for page_size in (1, 2, 3, 500):
        found = [
            e.effect_id for e in _all_pages(agent.gate.ListEffects, gate_pb2.ListEffectsRequest, "effects", page_size)
        ]
        assert len(found) == len(set(found)), "no effect twice"
        assert set(found) == mine, "every effect of the tenant, none of another"
        assert found == sorted(found), "effect_id order"
    assert ledger["other"].effect_id not in mine


def test_list_effects_filters(agent, ledger):
    def ids(**filters) -> set[str]:
        return {e.effect_id for e in agent.gate.ListEffects(gate_pb2.ListEffectsRequest(**filters)).effects}

    a, b = ledger["a"], ledger["b"]
    assert ids(stages=[common_pb2.UNKNOWN]) == {a[0].effect_id}
    assert ids(stages=[common_pb2.SUCCEEDED, common_pb2.UNKNOWN]) == {a[0].effect_id, a[1].effect_id}
    assert ids(run_id=ledger["run_b"]) == {r.effect_id for r in b}
    assert ids(tool="crm.update") == {r.effect_id for r in b}
    assert ids(tool="crm.update", target="crm:1") == {b[1].effect_id}
    assert ids(run_id=ledger["other_run"]) == set()
    assert ids(created_before=PAST) == set()
    assert len(ids(created_after=PAST, created_before=FUTURE)) == 7
    assert ids(run_id=ledger["run_a"], stages=[common_pb2.AUTHORIZED]) == {r.effect_id for r in a[2:]}


def test_list_runs_pages_filters_and_tenant(agent, ledger):
    labelled = [
        agent.runs.CreateRun(runs_pb2.CreateRunRequest(labels={"team": name})).run_id for name in ("red", "blue", "red")
    ]
    mine = {ledger["run_a"], ledger["run_b"], *labelled}
    for page_size in (1, 2, 500):
        found = [r.run_id for r in _all_pages(agent.runs.ListRuns, runs_pb2.ListRunsRequest, "runs", page_size)]
        assert len(found) == len(set(found)) and found == sorted(found)
        assert set(found) == mine
    assert ledger["other_run"] not in mine

    def ids(**filters) -> set[str]:
        return {r.run_id for r in agent.runs.ListRuns(runs_pb2.ListRunsRequest(**filters)).runs}

    assert ids(label_key="team") == set(labelled)
    assert ids(label_key="team", label_value="red") == {labelled[0], labelled[2]}
    assert ids(label_key="team", label_value="green") == set()
    assert ids(label_key="colour") == set()
    assert ids(created_before=PAST) == set()
    reds = _all_pages(
        agent.runs.ListRuns,
        lambda **page: runs_pb2.ListRunsRequest(label_key="team", label_value="red", **page),
        "runs",
        1,
    )
    assert [r.run_id for r in reds] == [labelled[0], labelled[2]]


def test_list_decisions_filters_pages_and_leaves_out_the_input(agent, ledger):
    a = ledger["a"]
    again = agent.gate.AuthorizeEffect(authorize_request(ledger["run_a"], "a-2"))  # attempt still open
    assert again.outcome == common_pb2.RECONCILE_REQUIRED and again.reasons
    code = again.reasons[0].code
    decisions = _all_pages(agent.gate.ListDecisions, gate_pb2.ListDecisionsRequest, "decisions", 2)
    found = [d.decision_id for d in decisions]
    assert len(found) == len(set(found)) == 8 and found == sorted(found)
    assert all(d.input_json == b"" and d.input_digest for d in decisions)
    assert ledger["other"].decision_id not in found
    full = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=found[0]))
    assert full.input_json

    def ids(**filters) -> set[str]:
        return {d.decision_id for d in agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest(**filters)).decisions}

    assert ids(outcome=common_pb2.RECONCILE_REQUIRED) == {again.decision_id}
    assert ids(reason=code) == {again.decision_id}
    assert ids(reason=code + "_NOT") == set()
    assert ids(reason="%") == set()
    assert ids(outcome=common_pb2.ALLOW, run_id=ledger["run_a"]) == {r.decision_id for r in a}
    assert ids(tool="crm.update") == {r.decision_id for r in ledger["b"]}


def test_list_budgets_pages_filters_and_tenant(agent, admin, tenant, ledger, server, database_url):
    run_a, run_b = ledger["run_a"], ledger["run_b"]
    auditor = tenant.client(server, "auditor")

    def put(scope, scope_id: str, dimension: str, limit: int) -> str:
        request = budgets_pb2.PutBudgetRequest(scope=scope, scope_id=scope_id, dimension=dimension, limit=limit)
        return admin.budgets.PutBudget(request).budget_id

    tenant_calls = put(budgets_pb2.TENANT, "", "tool_calls", 1000)
    run_a_usd = put(budgets_pb2.RUN, run_a, "usd_micros", 5)
    run_b_usd = put(budgets_pb2.RUN, run_b, "usd_micros", 1_000_000)
    tree_b = put(budgets_pb2.RUN_TREE, run_b, "tool_calls", 10)
    # Exhaust run A's: a fact posts even past the limit.
    agent.budgets.RecordUsage(
        budgets_pb2.RecordUsageRequest(
            run_id=run_a,
            provider="p",
            model="m",
            segment="s",
            usage={"usd_micros": 7},
            request_id="u-1",
        )
    )
    other = new_tenant(database_url)
    other_admin = other.client(server, "admin")
    other_admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="tool_calls", limit=1)
    )
    other_admin.close()

    mine = {tenant_calls, run_a_usd, run_b_usd, tree_b}
    for page_size in (1, 3, 500):
        found = [
            b.budget_id
            for b in _all_pages(auditor.budgets.ListBudgets, budgets_pb2.ListBudgetsRequest, "budgets", page_size)
        ]
        assert len(found) == len(set(found)) and found == sorted(found)
        assert set(found) == mine, "every budget of the tenant, none of another"
    auditor.close()

    def ids(**filters) -> set[str]:
        return {b.budget_id for b in agent.budgets.ListBudgets(budgets_pb2.ListBudgetsRequest(**filters)).budgets}

    assert ids(scope=budgets_pb2.RUN) == {run_a_usd, run_b_usd}
    assert ids(scope_id=run_b) == {run_b_usd, tree_b}
    assert ids(scope=budgets_pb2.RUN_TREE, scope_id=run_b) == {tree_b}
    assert ids(dimension="usd_micros") == {run_a_usd, run_b_usd}
    assert ids(exhausted_only=True) == {run_a_usd}
    exhausted = agent.budgets.ListBudgets(budgets_pb2.ListBudgetsRequest(exhausted_only=True)).budgets[0]
    assert (exhausted.limit, exhausted.posted, exhausted.available, exhausted.exhausted) == (5, 7, 0, True)
    for bad, reason, field in (
        (budgets_pb2.ListBudgetsRequest(scope=9), "INVALID_ENUM", "scope"),
        (budgets_pb2.ListBudgetsRequest(scope=budgets_pb2.TENANT, scope_id=run_a), None, "scope_id"),
        (budgets_pb2.ListBudgetsRequest(dimension="Not-A-Dimension"), "INVALID_DIMENSION", "dimension"),
        (budgets_pb2.ListBudgetsRequest(page_size=501), "INVALID_PAGE_SIZE", "page_size"),
    ):
        with raises_error("INVALID_ARGUMENT", reason):
            agent.budgets.ListBudgets(bad)
        assert raises_error.last.violations[0].field == field


@pytest.mark.parametrize(
    ("rpc", "request_", "reason", "field"),
    [
        ("ListEffects", gate_pb2.ListEffectsRequest(stages=[99]), "INVALID_ENUM", "stages[0]"),
        ("ListEffects", gate_pb2.ListEffectsRequest(stages=[0]), "FIELD_REQUIRED", "stages[0]"),
        ("ListEffects", gate_pb2.ListEffectsRequest(run_id="no spaces"), "INVALID_ID", "run_id"),
        ("ListEffects", gate_pb2.ListEffectsRequest(tool="bad tool"), "INVALID_TOOL_NAME", "tool"),
        ("ListEffects", gate_pb2.ListEffectsRequest(target="x" * 2000), None, "target"),
        (
            "ListEffects",
            gate_pb2.ListEffectsRequest(created_after=Timestamp(seconds=-(10**12))),
            "INVALID_TIMESTAMP",
            "created_after",
        ),
        (
            "ListEffects",
            gate_pb2.ListEffectsRequest(created_after=FUTURE, created_before=PAST),
            "INVALID_RANGE",
            "created_before",
        ),
        ("ListEffects", gate_pb2.ListEffectsRequest(page_size=501), "INVALID_PAGE_SIZE", "page_size"),
        ("ListEffects", gate_pb2.ListEffectsRequest(page_token="AA=="), "INVALID_PAGE_TOKEN", "page_token"),
        ("ListDecisions", gate_pb2.ListDecisionsRequest(outcome=99), "INVALID_ENUM", "outcome"),
        ("ListDecisions", gate_pb2.ListDecisionsRequest(reason="two words"), "INVALID_ID", "reason"),
        ("ListDecisions", gate_pb2.ListDecisionsRequest(run_id="\x00"), "INVALID_ID", "run_id"),
        ("ListRuns", runs_pb2.ListRunsRequest(label_value="red"), "FIELD_REQUIRED", "label_value"),
        ("ListRuns", runs_pb2.ListRunsRequest(label_key="k" * 64), None, "label_key"),
        (
            "ListRuns",
            runs_pb2.ListRunsRequest(created_before=Timestamp(seconds=10**13)),
            "INVALID_TIMESTAMP",
            "created_before",
        ),
    ],
)
def test_bad_filters_are_invalid_argument_with_a_field_violation(agent, rpc, request_, reason, field):
    stub = agent.runs if rpc == "ListRuns" else agent.gate
    with raises_error("INVALID_ARGUMENT", reason):
        getattr(stub, rpc)(request_)
    assert raises_error.last.violations[0].field == field
