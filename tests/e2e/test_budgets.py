"""Every budget rule, over real gRPC, on PostgreSQL and on SQLite.

Budgets reserve before they spend: an ALLOW reserves the estimate in every applicable budget
(posted + pending <= limit), the outcome settles the reservation (posted, voided or expired),
and provider usage reported through RecordUsage is a fact that is posted even past the limit.
Reservation states that the API does not show once settled are read from the database.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from sqlalchemy import select

from effect_ledger.client import _Stub
from effect_ledger.storage.engine import DatabaseSettings, create_sync
from effect_ledger.storage.schema import reservations
from effectledger.v1 import budgets_pb2, budgets_pb2_grpc, common_pb2, gate_pb2, runs_pb2
from support import (
    authorize_request,
    contract,
    failed,
    new_run,
    new_tenant,
    outcome_name,
    raises_error,
    stage_name,
    succeeded,
    unknown,
)

INT64_MAX = 2**63 - 1
USD = "usd_micros"
TOOL = "email.send"
# Long enough that no lease runs out during a test unless the test wants it to.
LEASE_SECONDS = 3600

TENANT = budgets_pb2.TENANT
RUN = budgets_pb2.RUN
RUN_TREE = budgets_pb2.RUN_TREE


# --- clients and helpers -------------------------------------------------------------------


class BudgetsClient:
    """The Budgets service with a principal's token (LedgerClient has no attribute for it)."""

    def __init__(self, server, token: str) -> None:
        self.channel = grpc.insecure_channel(server.target)
        self.stub = _Stub(budgets_pb2_grpc.BudgetsStub(self.channel), (("authorization", "Bearer " + token),), 10.0)

    def put(self, scope: int, dimension: str, limit: int, scope_id: str = "", reset_period_seconds: int = 0):
        return self.stub.PutBudget(
            budgets_pb2.PutBudgetRequest(
                scope=scope,
                scope_id=scope_id,
                dimension=dimension,
                limit=limit,
                reset_period_seconds=reset_period_seconds,
            )
        )

    def get(self, scope: int, scope_id: str = "") -> budgets_pb2.GetBudgetResponse:
        return self.stub.GetBudget(budgets_pb2.GetBudgetRequest(scope=scope, scope_id=scope_id))

    def one(self, scope: int, dimension: str, scope_id: str = "") -> budgets_pb2.Budget:
        found = [b for b in self.get(scope, scope_id).budgets if b.dimension == dimension]
        assert len(found) == 1, found
        return found[0]

    def usage(
        self,
        run_id: str,
        usage: dict[str, int],
        *,
        provider: str = "openai",
        model: str = "gpt-x",
        segment: str = "s1",
        request_id: str = "",
    ) -> budgets_pb2.RecordUsageResponse:
        return self.stub.RecordUsage(
            budgets_pb2.RecordUsageRequest(
                run_id=run_id, provider=provider, model=model, segment=segment, usage=usage, request_id=request_id
            )
        )

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def budgets(server, tenant):
    """The Budgets service as the tenant's admin."""
    client = BudgetsClient(server, tenant.tokens["admin"])
    yield client
    client.close()


@pytest.fixture
def agent_budgets(server, tenant):
    client = BudgetsClient(server, tenant.tokens["agent"])
    yield client
    client.close()


_engines: dict[str, object] = {}


def reservation_rows(database_url: str, tenant, **where) -> list:
    """The tenant's reservations as stored, optionally narrowed by column values."""
    engine = _engines.get(database_url)
    if engine is None:
        engine = _engines[database_url] = create_sync(DatabaseSettings(database_url))
    query = select(reservations).where(reservations.c.tenant_id == tenant.name)
    for column, value in where.items():
        query = query.where(reservations.c[column] == value)
    with engine.connect() as connection:
        return list(connection.execute(query.order_by(reservations.c.created_at)).all())


def state_of(database_url: str, tenant, reservation_id: str) -> tuple[str, int]:
    rows = reservation_rows(database_url, tenant, reservation_id=reservation_id)
    assert len(rows) == 1
    return rows[0].state, rows[0].posted_amount


def authorize(
    run_id: str,
    key: str,
    estimate: dict[str, int] | None = None,
    *,
    tool: str = TOOL,
    target: str | None = None,
    arguments: bytes | None = None,
) -> gate_pb2.AuthorizeEffectRequest:
    request = authorize_request(
        run_id,
        key,
        tool=tool,
        target=target or f"mailto:{key}@example.com",
        **({"arguments": arguments} if arguments is not None else {}),
    )
    request.estimate.update(estimate or {})
    return request


def succeeded_with(attempt_id: str, usage: dict[str, int], reference: str = "ref-1") -> gate_pb2.RecordOutcomeRequest:
    request = succeeded(attempt_id, reference)
    request.succeeded.usage.update(usage)
    return request


def contract_with(tool: str = TOOL, default_estimate: dict[str, int] | None = None, **kwargs):
    request = contract(tool, **{"lease_seconds": LEASE_SECONDS, **kwargs})
    request.contract.default_estimate.update(default_estimate or {})
    return request


def reason_codes(response) -> list[str]:
    return [reason.code for reason in response.reasons]


def counters(budget) -> tuple[int, int, int]:
    return budget.posted, budget.pending, budget.available


def reconcile_receipt(effect_id: str, reference: str = "found") -> gate_pb2.ReconcileEffectRequest:
    return gate_pb2.ReconcileEffectRequest(
        effect_id=effect_id, receipt=common_pb2.Receipt(provider_reference=reference, detail_json=b"{}")
    )


def reconcile_not_happened(effect_id: str) -> gate_pb2.ReconcileEffectRequest:
    return gate_pb2.ReconcileEffectRequest(
        effect_id=effect_id,
        not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="provider has nothing with our key"),
    )


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --- PutBudget / GetBudget -----------------------------------------------------------------


def test_put_budget_is_for_admins_in_every_scope_and_get_budget_shows_the_counters(
    server, database_url, tenant, agent, admin, budgets, agent_budgets
):
    run_id = new_run(agent)
    with raises_error("PERMISSION_DENIED", "ROLE_REQUIRED"):
        agent_budgets.put(TENANT, USD, 1000)
    with raises_error("NOT_FOUND"):
        budgets.get(TENANT)

    tenant_budget = budgets.put(TENANT, USD, 5000)
    run_budget = budgets.put(RUN, "tokens_in", 700, scope_id=run_id)
    tree_budget = budgets.put(RUN_TREE, "tool_calls", 3, scope_id=run_id)
    for made, scope, scope_id, limit in (
        (tenant_budget, TENANT, "", 5000),
        (run_budget, RUN, run_id, 700),
        (tree_budget, RUN_TREE, run_id, 3),
    ):
        assert made.budget_id and made.scope == scope and made.scope_id == scope_id
        assert (made.limit, *counters(made)) == (limit, 0, 0, limit) and not made.exhausted
    assert len({tenant_budget.budget_id, run_budget.budget_id, tree_budget.budget_id}) == 3

    admin.tools.PutToolContract(contract_with())
    allowed = agent.gate.AuthorizeEffect(authorize(run_id, "k1", {USD: 100, "tokens_in": 50, "tool_calls": 1}))
    assert outcome_name(allowed) == "ALLOW"
    assert len(allowed.reservation_ids) == 3 and len(set(allowed.reservation_ids)) == 3

    shown = budgets.get(TENANT)
    assert [b.budget_id for b in shown.budgets] == [tenant_budget.budget_id]
    assert (shown.budgets[0].limit, *counters(shown.budgets[0])) == (5000, 0, 100, 4900)
    [open_reservation] = shown.open_reservations
    assert open_reservation.reservation_id in allowed.reservation_ids
    assert open_reservation.attempt_id == allowed.attempt_id and open_reservation.effect_id == allowed.effect_id
    assert (open_reservation.dimension, open_reservation.amount) == (USD, 100)
    assert open_reservation.state == budgets_pb2.RESERVATION_PENDING
    assert open_reservation.budget_id == tenant_budget.budget_id

    run_shown = budgets.get(RUN, run_id)
    assert [(b.dimension, b.limit, *counters(b)) for b in run_shown.budgets] == [("tokens_in", 700, 0, 50, 650)]
    assert [(r.dimension, r.amount) for r in run_shown.open_reservations] == [("tokens_in", 50)]
    tree_shown = budgets.get(RUN_TREE, run_id)
    assert [(b.dimension, b.limit, *counters(b)) for b in tree_shown.budgets] == [("tool_calls", 3, 0, 1, 2)]

    # Every role reads; a put of the same (scope, scope_id, dimension) updates the one budget.
    assert agent_budgets.get(TENANT).budgets[0].budget_id == tenant_budget.budget_id
    auditor = BudgetsClient(server, tenant.tokens["auditor"])
    try:
        assert auditor.one(RUN, "tokens_in", run_id).pending == 50
        with raises_error("PERMISSION_DENIED"):
            auditor.put(TENANT, USD, 1)
    finally:
        auditor.close()
    raised = budgets.put(TENANT, USD, 6000)
    assert raised.budget_id == tenant_budget.budget_id and counters(raised) == (0, 100, 5900)

    # Runs of another tenant do not exist here; neither do runs nobody created.
    other = new_tenant(database_url)
    with other.client(server, "agent") as other_agent:
        other_run = new_run(other_agent)
    for scope in (RUN, RUN_TREE):
        with raises_error("NOT_FOUND"):
            budgets.put(scope, USD, 1000, scope_id=other_run)
        with raises_error("NOT_FOUND"):
            budgets.put(scope, USD, 1000, scope_id="run-nobody-created")
        with raises_error("NOT_FOUND"):
            budgets.get(scope, other_run)
    with raises_error("INVALID_ARGUMENT"):
        budgets.put(TENANT, USD, 1000, scope_id=run_id)
    with raises_error("INVALID_ARGUMENT"):
        budgets.put(TENANT, USD, -1)
    with raises_error("INVALID_ARGUMENT"):
        budgets.put(TENANT, "Not-A-Dimension", 1)
    assert reservation_rows(database_url, other) == []


# --- reserving -----------------------------------------------------------------------------


def test_sixteen_concurrent_authorizations_of_100_against_1000_allow_exactly_ten(
    database_url, tenant, agent, admin, budgets
):
    admin.tools.PutToolContract(contract_with())
    budget = budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda i: agent.gate.AuthorizeEffect(authorize(run_id, f"k{i}", {USD: 100})), range(16))
        )

    assert Counter(outcome_name(a) for a in answers) == {"ALLOW": 10, "DENY": 6}
    allowed = [a for a in answers if outcome_name(a) == "ALLOW"]
    for answer in allowed:
        assert answer.attempt_id and len(answer.reservation_ids) == 1
    for answer in answers:
        if outcome_name(answer) == "DENY":
            assert reason_codes(answer) == ["BUDGET_EXHAUSTED"]
            assert USD in answer.reasons[0].message
            assert not answer.attempt_id and not answer.reservation_ids
    reservation_ids = {r for a in allowed for r in a.reservation_ids}
    assert len(reservation_ids) == 10

    shown = budgets.get(TENANT)
    assert counters(shown.budgets[0]) == (0, 1000, 0) and shown.budgets[0].exhausted
    assert {r.reservation_id for r in shown.open_reservations} == reservation_ids
    assert {r.amount for r in shown.open_reservations} == {100}
    rows = reservation_rows(database_url, tenant)
    assert len(rows) == 10 and {row.state for row in rows} == {"PENDING"}
    assert {row.budget_id for row in rows} == {budget.budget_id}

    late = agent.gate.AuthorizeEffect(authorize(run_id, "late", {USD: 1}))
    assert outcome_name(late) == "DENY" and reason_codes(late) == ["BUDGET_EXHAUSTED"]
    assert f"dimension {USD}" in late.reasons[0].message
    # Giving one authorization back makes room for exactly one more of the same size.
    agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=allowed[0].attempt_id, reason="not needed"))
    assert outcome_name(agent.gate.AuthorizeEffect(authorize(run_id, "after-release", {USD: 100}))) == "ALLOW"
    assert outcome_name(agent.gate.AuthorizeEffect(authorize(run_id, "one-too-many", {USD: 100}))) == "DENY"
    assert counters(budgets.one(TENANT, USD)) == (0, 1000, 0)


def test_a_contract_default_estimate_is_a_floor_the_request_may_raise_never_lower(agent, admin, budgets):
    admin.tools.PutToolContract(contract_with(default_estimate={USD: 250, "tool_calls": 1}))
    budgets.put(TENANT, USD, 10_000)
    budgets.put(TENANT, "tool_calls", 10)
    run_id = new_run(agent)
    cases = {
        "defaults": ({}, {USD: 250, "tool_calls": 1}),
        "usd-lowered": ({USD: 40}, {USD: 250, "tool_calls": 1}),
        "zeros": ({USD: 0, "tool_calls": 0}, {USD: 250, "tool_calls": 1}),
        "calls-raised": ({"tool_calls": 2}, {USD: 250, "tool_calls": 2}),
        "both-raised": ({USD: 700, "tool_calls": 3}, {USD: 700, "tool_calls": 3}),
    }
    attempts = {}
    for key, (estimate, expected) in cases.items():
        answer = agent.gate.AuthorizeEffect(authorize(run_id, key, estimate))
        assert outcome_name(answer) == "ALLOW" and len(answer.reservation_ids) == 2
        attempts[answer.attempt_id] = key
        decision = json.loads(
            agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=answer.decision_id)).input_json
        )
        # Policy sees what the ledger reserves and, apart, what the caller asked for.
        assert decision["estimate"] == expected
        assert decision["request"]["estimate"] == estimate

    reserved: dict[str, dict[str, int]] = {key: {} for key in cases}
    for budget_scope_reservation in budgets.get(TENANT).open_reservations:
        reserved[attempts[budget_scope_reservation.attempt_id]][budget_scope_reservation.dimension] = (
            budget_scope_reservation.amount
        )
    assert reserved == {key: expected for key, (_, expected) in cases.items()}
    assert budgets.one(TENANT, USD).pending == 250 + 250 + 250 + 250 + 700
    assert budgets.one(TENANT, "tool_calls").pending == 1 + 1 + 1 + 2 + 3


def test_an_exhausted_budget_cannot_be_bypassed_with_a_zero_estimate(agent, admin, budgets):
    """Every attempt is one tool call unless its contract says otherwise; a zero estimate from
    the caller changes nothing."""
    admin.tools.PutToolContract(contract_with())
    budgets.put(RUN, "tool_calls", 2, scope_id=(run_id := new_run(agent)))
    for key in ("a", "b"):
        assert outcome_name(agent.gate.AuthorizeEffect(authorize(run_id, key, {}))) == "ALLOW"
    for index in range(6):
        answer = agent.gate.AuthorizeEffect(authorize(run_id, f"zero-{index}", {USD: 0, "tool_calls": 0}))
        assert outcome_name(answer) == "DENY" and "BUDGET_EXHAUSTED" in [r.code for r in answer.reasons]
    assert counters(budgets.one(RUN, "tool_calls", scope_id=run_id)) == (0, 2, 0)


def test_a_tool_that_costs_nothing_says_so_in_its_contract(agent, admin, budgets):
    admin.tools.PutToolContract(contract_with(default_estimate={"tool_calls": 0}))
    run_id = new_run(agent)
    budgets.put(RUN, "tool_calls", 1, scope_id=run_id)
    for key in ("a", "b", "c"):
        answer = agent.gate.AuthorizeEffect(authorize(run_id, key, {}))
        assert outcome_name(answer) == "ALLOW" and not answer.reservation_ids
    assert counters(budgets.one(RUN, "tool_calls", scope_id=run_id)) == (0, 0, 1)


def test_usage_reported_below_the_floor_posts_the_floor(agent, admin, budgets):
    admin.tools.PutToolContract(contract_with(default_estimate={USD: 300}))
    budgets.put(TENANT, USD, 10_000)
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize(run_id, "low", {}))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
    agent.gate.RecordOutcome(succeeded_with(allowed.attempt_id, {USD: 0}))
    assert counters(budgets.one(TENANT, USD)) == (300, 0, 9_700)


def test_a_contract_default_estimate_must_be_valid(admin):
    for estimate in ({USD: -1}, {"Bad-Name": 1}):
        with raises_error("INVALID_ARGUMENT", "INVALID_TOOL_CONTRACT"):
            admin.tools.PutToolContract(contract_with(default_estimate=estimate))


# --- settling ------------------------------------------------------------------------------


def test_succeeded_posts_actual_usage_or_the_estimate_and_releases_the_rest(
    database_url, tenant, agent, admin, budgets
):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    budgets.put(TENANT, "tokens_out", 1000)
    run_id = new_run(agent)

    first = agent.gate.AuthorizeEffect(authorize(run_id, "actual", {USD: 100}))
    assert counters(budgets.one(TENANT, USD)) == (0, 100, 900)
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    done = agent.gate.RecordOutcome(succeeded_with(first.attempt_id, {USD: 60, "tokens_out": 30}))
    assert stage_name(done.attempt.stage) == "SUCCEEDED"
    assert counters(budgets.one(TENANT, USD)) == (60, 0, 940)
    # Usage in a dimension nothing was reserved for is still a fact, and posted.
    assert counters(budgets.one(TENANT, "tokens_out")) == (30, 0, 970)
    assert state_of(database_url, tenant, first.reservation_ids[0]) == ("POSTED", 60)

    second = agent.gate.AuthorizeEffect(authorize(run_id, "estimate", {USD: 100}))
    agent.gate.RecordOutcome(succeeded(second.attempt_id))
    assert counters(budgets.one(TENANT, USD)) == (160, 0, 840)
    assert state_of(database_url, tenant, second.reservation_ids[0]) == ("POSTED", 100)

    # A repeated report changes nothing, and posts nothing again.
    echo = agent.gate.RecordOutcome(succeeded(second.attempt_id))
    assert not echo.changed
    assert counters(budgets.one(TENANT, USD)) == (160, 0, 840)
    assert budgets.get(TENANT).open_reservations == []


def test_a_definite_failure_and_a_release_void_the_reservation(database_url, tenant, agent, admin, budgets):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)

    rejected = agent.gate.AuthorizeEffect(authorize(run_id, "rejected", {USD: 100}))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=rejected.attempt_id))
    assert counters(budgets.one(TENANT, USD)) == (0, 100, 900)
    agent.gate.RecordOutcome(failed(rejected.attempt_id))
    assert counters(budgets.one(TENANT, USD)) == (0, 0, 1000)
    assert state_of(database_url, tenant, rejected.reservation_ids[0]) == ("VOIDED", 0)

    not_sent = agent.gate.AuthorizeEffect(authorize(run_id, "not-sent", {USD: 100}))
    agent.gate.RecordOutcome(failed(not_sent.attempt_id, gate_pb2.NOT_SENT, "never sent"))
    assert state_of(database_url, tenant, not_sent.reservation_ids[0]) == ("VOIDED", 0)

    released = agent.gate.AuthorizeEffect(authorize(run_id, "released", {USD: 300}))
    assert counters(budgets.one(TENANT, USD)) == (0, 300, 700)
    agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=released.attempt_id, reason="plan changed"))
    assert counters(budgets.one(TENANT, USD)) == (0, 0, 1000)
    assert state_of(database_url, tenant, released.reservation_ids[0]) == ("VOIDED", 0)

    # A fresh attempt after the definite failure reserves again, and a new reservation it is.
    retry = agent.gate.AuthorizeEffect(authorize(run_id, "rejected", {USD: 100}))
    assert outcome_name(retry) == "ALLOW" and retry.attempt_number == 2
    assert retry.reservation_ids[0] != rejected.reservation_ids[0]
    assert counters(budgets.one(TENANT, USD)) == (0, 100, 900)


def test_unknown_holds_the_money_until_reconcile_posts_or_voids_it(
    database_url, tenant, agent, admin, operator, budgets
):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)

    happened = agent.gate.AuthorizeEffect(authorize(run_id, "happened", {USD: 100}))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=happened.attempt_id))
    agent.gate.RecordOutcome(unknown(happened.attempt_id))
    did_not = agent.gate.AuthorizeEffect(authorize(run_id, "did-not", {USD: 100}))
    agent.gate.RecordOutcome(unknown(did_not.attempt_id))
    shown = budgets.get(TENANT)
    assert counters(shown.budgets[0]) == (0, 200, 800)
    assert {r.attempt_id for r in shown.open_reservations} == {happened.attempt_id, did_not.attempt_id}
    # Asking again while it is unknown reserves nothing more.
    assert outcome_name(agent.gate.AuthorizeEffect(authorize(run_id, "happened", {USD: 100}))) == "RECONCILE_REQUIRED"
    assert counters(budgets.one(TENANT, USD)) == (0, 200, 800)

    reconciled = agent.gate.ReconcileEffect(reconcile_receipt(happened.effect_id))
    assert stage_name(reconciled.stage) == "SUCCEEDED"
    assert counters(budgets.one(TENANT, USD)) == (100, 100, 800)
    assert state_of(database_url, tenant, happened.reservation_ids[0]) == ("POSTED", 100)

    voided = operator.gate.ReconcileEffect(reconcile_not_happened(did_not.effect_id))
    assert stage_name(voided.stage) == "FAILED"
    assert counters(budgets.one(TENANT, USD)) == (100, 0, 900)
    assert state_of(database_url, tenant, did_not.reservation_ids[0]) == ("VOIDED", 0)
    assert budgets.get(TENANT).open_reservations == []


def test_a_deny_or_a_refused_key_reuse_holds_nothing(database_url, tenant, agent, admin, budgets):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)
    first = agent.gate.AuthorizeEffect(authorize(run_id, "k", {USD: 100}, target="mailto:bob@example.com"))
    assert outcome_name(first) == "ALLOW"

    with raises_error("FAILED_PRECONDITION", "IDEMPOTENCY_KEY_REUSED"):
        agent.gate.AuthorizeEffect(authorize(run_id, "k", {USD: 100}, target="mailto:eve@example.com"))
    too_big = agent.gate.AuthorizeEffect(authorize(run_id, "too-big", {USD: 901}))
    assert outcome_name(too_big) == "DENY" and reason_codes(too_big) == ["BUDGET_EXHAUSTED"]
    no_tool = agent.gate.AuthorizeEffect(authorize(run_id, "no-tool", {USD: 100}, tool="never.registered"))
    assert outcome_name(no_tool) == "DENY" and "TOOL_UNKNOWN" in reason_codes(no_tool)
    for denied in (too_big, no_tool):
        assert not denied.reservation_ids and not denied.attempt_id
    assert counters(budgets.one(TENANT, USD)) == (0, 100, 900)
    assert [row.reservation_id for row in reservation_rows(database_url, tenant)] == list(first.reservation_ids)

    agent.gate.RecordOutcome(succeeded(first.attempt_id))
    duplicate = agent.gate.AuthorizeEffect(authorize(run_id, "k", {USD: 100}, target="mailto:bob@example.com"))
    assert outcome_name(duplicate) == "DUPLICATE" and not duplicate.reservation_ids
    assert counters(budgets.one(TENANT, USD)) == (100, 0, 900)
    assert len(reservation_rows(database_url, tenant)) == 1


def test_lease_expiry_expires_a_never_dispatched_reservation_and_holds_a_dispatched_one(
    database_url, tenant, agent, admin, budgets
):
    admin.tools.PutToolContract(contract_with("lease.short", lease_seconds=1))
    budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)
    idle = agent.gate.AuthorizeEffect(authorize(run_id, "idle", {USD: 100}, tool="lease.short"))
    sent = agent.gate.AuthorizeEffect(authorize(run_id, "sent", {USD: 300}, tool="lease.short"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=sent.attempt_id))
    assert counters(budgets.one(TENANT, USD)) == (0, 400, 600)

    def expiries_recorded() -> bool:
        events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
        expired = {json.loads(e.payload_json)["attempt_id"] for e in events if e.type == "attempt.lease_expired"}
        return expired >= {idle.attempt_id, sent.attempt_id}

    assert wait_for(expiries_recorded), "the sweeper did not record both lease expiries"
    assert state_of(database_url, tenant, idle.reservation_ids[0]) == ("EXPIRED", 0)
    assert state_of(database_url, tenant, sent.reservation_ids[0]) == ("PENDING", 0)
    shown = budgets.get(TENANT)
    assert counters(shown.budgets[0]) == (0, 300, 700)
    assert [r.attempt_id for r in shown.open_reservations] == [sent.attempt_id]
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=sent.effect_id))
    assert stage_name(effect.stage) == "UNKNOWN"

    agent.gate.ReconcileEffect(reconcile_receipt(sent.effect_id))
    assert counters(budgets.one(TENANT, USD)) == (300, 0, 700)
    assert state_of(database_url, tenant, sent.reservation_ids[0]) == ("POSTED", 300)
    assert state_of(database_url, tenant, idle.reservation_ids[0]) == ("EXPIRED", 0)

    # The never-dispatched attempt turns out to have happened after all: its estimate is posted
    # as a fact when the receipt reconciles it, and its reservation stays EXPIRED.
    agent.gate.ReconcileEffect(reconcile_receipt(idle.effect_id))
    assert counters(budgets.one(TENANT, USD)) == (400, 0, 600)
    assert state_of(database_url, tenant, idle.reservation_ids[0]) == ("EXPIRED", 0)


# --- RecordUsage ---------------------------------------------------------------------------


def test_record_usage_is_a_fact_that_may_cross_the_limit_and_exhausts_the_budget(
    server, tenant, agent, admin, budgets, agent_budgets
):
    admin.tools.PutToolContract(contract_with())
    budget = budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)
    held = agent.gate.AuthorizeEffect(authorize(run_id, "held", {USD: 100}))
    assert outcome_name(held) == "ALLOW"

    reported = agent_budgets.usage(run_id, {USD: 1500})
    assert reported.usage_id
    [after] = [b for b in reported.budgets if b.budget_id == budget.budget_id]
    assert (after.posted, after.pending, after.available, after.exhausted) == (1500, 100, 0, True)
    shown = budgets.one(TENANT, USD)
    assert (shown.posted, shown.pending, shown.available, shown.exhausted) == (1500, 100, 0, True)

    denied = agent.gate.AuthorizeEffect(authorize(run_id, "next", {USD: 1}))
    assert outcome_name(denied) == "DENY" and reason_codes(denied) == ["BUDGET_EXHAUSTED"]
    assert USD in denied.reasons[0].message
    # The held reservation still settles normally, on top of the usage.
    agent.gate.RecordOutcome(succeeded(held.attempt_id))
    assert counters(budgets.one(TENANT, USD)) == (1600, 0, 0)

    auditor = BudgetsClient(server, tenant.tokens["auditor"])
    try:
        with raises_error("PERMISSION_DENIED"):
            auditor.usage(run_id, {USD: 1})
    finally:
        auditor.close()
    with raises_error("NOT_FOUND"):
        agent_budgets.usage("run-nobody-created", {USD: 1})


def test_usage_of_several_segments_adds_up_and_a_retried_request_counts_once(agent, budgets, agent_budgets):
    run_id = new_run(agent)
    budgets.put(RUN, "tokens_in", 10_000, scope_id=run_id)
    budgets.put(TENANT, USD, 10_000)

    first = agent_budgets.usage(run_id, {"tokens_in": 300, USD: 30}, provider="openai", model="gpt-x", segment="s1")
    second = agent_budgets.usage(run_id, {"tokens_in": 200}, provider="anthropic", model="claude-y", segment="s2")
    # Back to the first provider and segment, with a smaller number: it adds, never refunds.
    third = agent_budgets.usage(run_id, {"tokens_in": 100}, provider="openai", model="gpt-x", segment="s1")
    assert len({first.usage_id, second.usage_id, third.usage_id}) == 3
    assert counters(budgets.one(RUN, "tokens_in", run_id)) == (600, 0, 9400)
    assert budgets.one(TENANT, USD).posted == 30

    once = agent_budgets.usage(run_id, {USD: 10}, request_id="usage-req-1")
    again = agent_budgets.usage(run_id, {USD: 10}, request_id="usage-req-1")
    assert once.usage_id == again.usage_id
    assert budgets.one(TENANT, USD).posted == 40
    [retried_view] = [b for b in again.budgets if b.dimension == USD]
    assert retried_view.posted == 40
    other = agent_budgets.usage(run_id, {USD: 10}, request_id="usage-req-2")
    assert other.usage_id != once.usage_id
    assert budgets.one(TENANT, USD).posted == 50
    # Zero usage is a fact too, and posts nothing.
    agent_budgets.usage(run_id, {USD: 0})
    assert budgets.one(TENANT, USD).posted == 50


# --- periods -------------------------------------------------------------------------------


def test_after_a_reset_period_posted_restarts_at_zero_and_pending_stays_held(agent, admin, budgets, agent_budgets):
    admin.tools.PutToolContract(contract_with())
    put = budgets.put(TENANT, USD, 1000, reset_period_seconds=1)
    assert put.reset_period_seconds == 1
    run_id = new_run(agent)
    held = agent.gate.AuthorizeEffect(authorize(run_id, "held", {USD: 100}))
    assert outcome_name(held) == "ALLOW"
    reported = agent_budgets.usage(run_id, {USD: 900})
    [after] = [b for b in reported.budgets if b.dimension == USD]
    assert (after.posted, after.pending, after.available, after.exhausted) == (900, 100, 0, True)

    started = after.period_started_at.ToDatetime()
    time.sleep(1.1)
    rolled = wait_for(lambda: (b := budgets.one(TENANT, USD)).posted == 0 and b, timeout=10)
    assert rolled, "posted never restarted at 0"
    assert (rolled.posted, rolled.pending, rolled.available, rolled.exhausted) == (0, 100, 900, False)
    assert rolled.period_started_at.ToDatetime() > started
    assert [r.attempt_id for r in budgets.get(TENANT).open_reservations] == [held.attempt_id]

    again = agent.gate.AuthorizeEffect(authorize(run_id, "again", {USD: 900}))
    assert outcome_name(again) == "ALLOW"


# --- amounts -------------------------------------------------------------------------------


def _violation_fields() -> list[str]:
    return [v.field for v in raises_error.last.violations]


def test_negative_unknown_and_overflowing_amounts_are_invalid_arguments(agent, admin, budgets, agent_budgets):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    run_id = new_run(agent)

    with raises_error("INVALID_ARGUMENT", "NEGATIVE_AMOUNT"):
        agent.gate.AuthorizeEffect(authorize(run_id, "neg", {USD: -1}))
    assert _violation_fields() == [f"estimate[{USD!r}]"]
    with raises_error("INVALID_ARGUMENT", "INVALID_DIMENSION"):
        agent.gate.AuthorizeEffect(authorize(run_id, "unknown-dim", {"gpu_seconds": 5}))
    assert _violation_fields() == ["estimate['gpu_seconds']"]
    with raises_error("INVALID_ARGUMENT"):
        agent.gate.AuthorizeEffect(authorize(run_id, "bad-name", {"GPU": 5}))
    assert len(_violation_fields()) == 1
    assert budgets.get(TENANT).open_reservations == []

    allowed = agent.gate.AuthorizeEffect(authorize(run_id, "ok", {USD: 100}))
    with raises_error("INVALID_ARGUMENT", "NEGATIVE_AMOUNT"):
        agent.gate.RecordOutcome(succeeded_with(allowed.attempt_id, {USD: -5}))
    assert _violation_fields() == [f"succeeded.usage[{USD!r}]"]
    with raises_error("INVALID_ARGUMENT", "INVALID_DIMENSION"):
        agent.gate.RecordOutcome(succeeded_with(allowed.attempt_id, {"gpu_seconds": 5}))
    assert _violation_fields() == ["succeeded.usage['gpu_seconds']"]
    # The refused reports changed nothing: the attempt is open and its money still held.
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert stage_name(effect.stage) == "AUTHORIZED"
    assert counters(budgets.one(TENANT, USD)) == (0, 100, 900)

    with raises_error("INVALID_ARGUMENT", "NEGATIVE_AMOUNT"):
        agent_budgets.usage(run_id, {USD: -1})
    assert _violation_fields() == [f"usage[{USD!r}]"]
    with raises_error("INVALID_ARGUMENT", "INVALID_DIMENSION"):
        agent_budgets.usage(run_id, {"gpu_seconds": 1})
    assert _violation_fields() == ["usage['gpu_seconds']"]

    # A dimension a budget of the tenant defines becomes known.
    budgets.put(RUN, "gpu_seconds", 50, scope_id=run_id)
    gpu = agent.gate.AuthorizeEffect(authorize(run_id, "gpu", {"gpu_seconds": 5}))
    assert outcome_name(gpu) == "ALLOW" and len(gpu.reservation_ids) == 1
    assert agent_budgets.usage(run_id, {"gpu_seconds": 1}).usage_id

    # Usage that fits in 64 bits is recorded; usage that would overflow the counter is not.
    assert agent_budgets.usage(run_id, {USD: INT64_MAX - 10}).usage_id
    assert budgets.one(TENANT, USD).posted == INT64_MAX - 10
    with raises_error("INVALID_ARGUMENT", "AMOUNT_OVERFLOW"):
        agent_budgets.usage(run_id, {USD: 11}, request_id="overflowing")
    assert _violation_fields() == [f"usage[{USD!r}]"]
    after = budgets.one(TENANT, USD)
    assert (after.posted, after.pending, after.available, after.exhausted) == (INT64_MAX - 10, 100, 0, True)
    # Nothing of the refused call was kept: the same request_id with a fitting amount records.
    agent_budgets.usage(run_id, {USD: 10}, request_id="overflowing")
    assert budgets.one(TENANT, USD).posted == INT64_MAX


def test_a_settlement_that_would_overflow_a_counter_is_refused_and_changes_nothing(
    database_url, tenant, agent, admin, budgets, agent_budgets
):
    admin.tools.PutToolContract(contract_with())
    budgets.put(TENANT, USD, 1000)
    budgets.put(TENANT, "tokens_out", 1000)
    run_id = new_run(agent)
    held = agent.gate.AuthorizeEffect(authorize(run_id, "held", {USD: 100}))
    assert outcome_name(held) == "ALLOW"
    agent_budgets.usage(run_id, {USD: INT64_MAX - 150})

    def unchanged(posted: int) -> None:
        effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=held.effect_id))
        assert stage_name(effect.stage) == "AUTHORIZED"
        assert counters(budgets.one(TENANT, USD)) == (posted, 100, 0)
        assert state_of(database_url, tenant, held.reservation_ids[0]) == ("PENDING", 0)

    # Reported usage that would overflow the posted counter.
    with raises_error("INVALID_ARGUMENT", "AMOUNT_OVERFLOW"):
        agent.gate.RecordOutcome(succeeded_with(held.attempt_id, {USD: 151}))
    assert _violation_fields() == [f"succeeded.usage[{USD!r}]"]
    unchanged(INT64_MAX - 150)
    # The reserved estimate, posted because the usage does not name the dimension.
    agent_budgets.usage(run_id, {USD: 60})
    with raises_error("INVALID_ARGUMENT", "AMOUNT_OVERFLOW"):
        agent.gate.RecordOutcome(succeeded(held.attempt_id))
    assert _violation_fields() == [f"estimate[{USD!r}]"]
    unchanged(INT64_MAX - 90)
    # Usage in a dimension nothing was reserved for.
    agent_budgets.usage(run_id, {"tokens_out": INT64_MAX})
    with raises_error("INVALID_ARGUMENT", "AMOUNT_OVERFLOW"):
        agent.gate.RecordOutcome(succeeded_with(held.attempt_id, {USD: 90, "tokens_out": 1}))
    assert _violation_fields() == ["succeeded.usage['tokens_out']"]
    unchanged(INT64_MAX - 90)

    done = agent.gate.RecordOutcome(succeeded_with(held.attempt_id, {USD: 90, "tokens_out": 0}))
    assert stage_name(done.attempt.stage) == "SUCCEEDED"
    assert counters(budgets.one(TENANT, USD)) == (INT64_MAX, 0, 0)
    assert budgets.one(TENANT, "tokens_out").posted == INT64_MAX
    assert state_of(database_url, tenant, held.reservation_ids[0]) == ("POSTED", 90)


# --- policy --------------------------------------------------------------------------------


def test_policy_input_lists_the_applicable_budgets_with_estimate_and_available(agent, admin, budgets):
    admin.tools.PutToolContract(contract_with())
    run_id = new_run(agent)
    elsewhere = new_run(agent)
    tenant_budget = budgets.put(TENANT, USD, 1000)
    run_budget = budgets.put(RUN, "tokens_in", 500, scope_id=run_id)
    tree_budget = budgets.put(RUN_TREE, "tool_calls", 5, scope_id=run_id)
    not_applicable = budgets.put(RUN, USD, 1000, scope_id=elsewhere)

    def policy_budgets(answer) -> dict[str, dict]:
        decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=answer.decision_id))
        return {b["budget_id"]: b for b in json.loads(decision.input_json)["budgets"]}

    first = agent.gate.AuthorizeEffect(authorize(run_id, "first", {USD: 100, "tokens_in": 20}))
    # Three: every attempt is also one tool call (the contract does not say otherwise).
    assert outcome_name(first) == "ALLOW" and len(first.reservation_ids) == 3
    seen = policy_budgets(first)
    assert set(seen) == {tenant_budget.budget_id, run_budget.budget_id, tree_budget.budget_id}
    assert not_applicable.budget_id not in seen
    facts = {b["dimension"]: (b["scope"], b["estimate"], b["available"], b["limit"]) for b in seen.values()}
    assert facts == {
        USD: ("TENANT", 100, 1000, 1000),
        "tokens_in": ("RUN", 20, 500, 500),
        "tool_calls": ("RUN_TREE", 1, 5, 5),
    }

    second = agent.gate.AuthorizeEffect(authorize(run_id, "second", {USD: 950}))
    assert outcome_name(second) == "DENY" and reason_codes(second) == ["BUDGET_EXHAUSTED"]
    assert USD in second.reasons[0].message and tenant_budget.budget_id in second.reasons[0].message
    seen = policy_budgets(second)
    assert (seen[tenant_budget.budget_id]["estimate"], seen[tenant_budget.budget_id]["available"]) == (950, 900)
    assert (seen[tenant_budget.budget_id]["pending"], seen[run_budget.budget_id]["pending"]) == (100, 20)
    decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=second.decision_id))
    assert decision.engine != "ledger", "the early denial is policy's, from the budget facts"
