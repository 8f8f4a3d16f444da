"""posted + pending <= limit at every instant, enforced by PostgreSQL across server processes.

Three ``effect-ledger serve`` processes share one fresh database and one small TENANT budget.
Two hundred AuthorizeEffect calls with random estimates (distinct keys and targets) are spread
over them: half at once, the rest over the next two seconds. Every ALLOW is settled, on another
server, while the others still arrive (succeeded with usage up to the estimate, a definite
failure, unknown then reconciled either way, or released). A sampler thread reads the budget
row straight from the database every few milliseconds: no committed state may ever exceed the
limit. At the end the counters must agree with the reservations row by row. The seed is printed
(and in every failure message) so a failing mix can be replayed with EFFECT_LEDGER_TEST_SEED.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import psycopg
import pytest

from effect_ledger.client import error_from_rpc
from effectledger.v1 import (
    budgets_pb2,
    budgets_pb2_grpc,
    common_pb2,
    gate_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)
from support import (
    ServerProcess,
    Tenant,
    authorize_request,
    contract,
    failed,
    psycopg_url,
    servers_on_fresh_database,
    succeeded,
    unknown,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SERVERS = 3
CALLS = 200
RUNS = 10
LIMIT = 2_000
ESTIMATE_MIN, ESTIMATE_MAX = 1, 200
USD = "usd_micros"
TOOL = "payment.charge"
CALL_TIMEOUT_SECONDS = 30.0
# Longer than the test runs: no lease runs out, so every reservation is settled by a report.
LEASE_SECONDS = 3600
SPREAD_SECONDS = 2.0
SAMPLE_INTERVAL_SECONDS = 0.003
# A call answered UNAVAILABLE (no pooled connection became free in time: nothing was written)
# is retried, as the client contract says, after a short randomized backoff.
UNAVAILABLE_RETRIES_MAX = 8
SEED = int(os.environ.get("EFFECT_LEDGER_TEST_SEED") or random.randrange(2**32))

ALLOW = common_pb2.ALLOW
DENY = common_pb2.DENY


@dataclass
class Cluster:
    url: str
    servers: list[ServerProcess]
    tenant: Tenant
    budget_id: str


@pytest.fixture(scope="module")
def cluster():
    with servers_on_fresh_database("el_budget_mp", SERVERS) as (url, servers, tenant):
        tenant.add("operator", "operator")
        admin = tenant.client(servers[0], "admin")
        admin.tools.PutToolContract(contract(TOOL, lease_seconds=LEASE_SECONDS))
        admin.close()
        with grpc.insecure_channel(servers[0].target) as channel:
            budget = budgets_pb2_grpc.BudgetsStub(channel).PutBudget(
                budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension=USD, limit=LIMIT),
                metadata=(("authorization", "Bearer " + tenant.tokens["admin"]),),
                timeout=CALL_TIMEOUT_SECONDS,
            )
        yield Cluster(url, servers, tenant, budget.budget_id)


# --- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What call ``index`` asks for, and how its attempt is settled if it is allowed."""

    index: int
    estimate: int
    # succeeded | failed | unknown | release
    settlement: str
    dispatch: bool
    usage: int  # for succeeded: 0..estimate
    reconcile_with_receipt: bool  # for unknown
    delay: float  # seconds after the start at which the call is made

    def expected(self) -> tuple[str, int]:
        """The reservation's final (state, posted_amount)."""
        if self.settlement == "succeeded":
            return "POSTED", self.usage
        if self.settlement == "unknown" and self.reconcile_with_receipt:
            return "POSTED", self.estimate
        return "VOIDED", 0


def make_plans(rng: random.Random) -> list[Plan]:
    plans = []
    for index in range(CALLS):
        estimate = rng.randint(ESTIMATE_MIN, ESTIMATE_MAX)
        settlement = rng.choice(["succeeded", "failed", "unknown", "release"])
        plans.append(
            Plan(
                index=index,
                estimate=estimate,
                settlement=settlement,
                # A release is only possible before dispatch; an unknown outcome comes after it.
                dispatch={"release": False, "unknown": True}.get(settlement, rng.random() < 0.5),
                usage=rng.randint(0, estimate),
                reconcile_with_receipt=rng.random() < 0.5,
                # Half fire at once (a race for the last units); the rest keep arriving while
                # earlier attempts settle, so reservations race settlements too.
                delay=0.0 if index % 2 == 0 else rng.uniform(0.0, SPREAD_SECONDS),
            )
        )
    return plans


# --- the sampler ---------------------------------------------------------------------------


@dataclass
class Sampler:
    """Reads the budget row directly, in its own connection, every few milliseconds."""

    url: str
    tenant_id: str
    budget_id: str
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            with psycopg.connect(psycopg_url(self.url), autocommit=True) as connection:
                while True:
                    stopping = self.stop.is_set()
                    row = connection.execute(
                        "SELECT posted, pending, limit_amount FROM budgets WHERE tenant_id = %s AND budget_id = %s",
                        (self.tenant_id, self.budget_id),
                    ).fetchone()
                    self.samples.append(tuple(row))
                    if stopping:
                        return
                    time.sleep(SAMPLE_INTERVAL_SECONDS)
        except BaseException as error:
            self.errors.append(error)


# --- the storm -----------------------------------------------------------------------------


@dataclass
class Outcomes:
    answers: dict[int, gate_pb2.AuthorizeEffectResponse] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    retries: int = 0


def describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name} {error_from_rpc(error).reason}: {error.details()}"


async def storm(cluster: Cluster, plans: list[Plan]) -> Outcomes:
    channels = [grpc.aio.insecure_channel(server.target) for server in cluster.servers]
    gates = [gate_pb2_grpc.GateStub(channel) for channel in channels]
    options = {
        "metadata": (("authorization", "Bearer " + cluster.tenant.tokens["agent"]),),
        "timeout": CALL_TIMEOUT_SECONDS,
    }
    outcomes = Outcomes()
    backoff = random.Random(SEED + 1)

    operator = {**options, "metadata": (("authorization", "Bearer " + cluster.tenant.tokens["operator"]),)}

    async def call(method, request, as_operator: bool = False):
        for attempt in range(UNAVAILABLE_RETRIES_MAX + 1):
            try:
                return await method(request, **(operator if as_operator else options))
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == UNAVAILABLE_RETRIES_MAX:
                    raise
                outcomes.retries += 1
                await asyncio.sleep(backoff.uniform(0.05, 0.2) * (attempt + 1))

    try:
        await asyncio.gather(*(channel.channel_ready() for channel in channels))
        run_ids = [
            (await runs_pb2_grpc.RunsStub(channels[0]).CreateRun(runs_pb2.CreateRunRequest(), **options)).run_id
            for _ in range(RUNS)
        ]

        async def settle(plan: Plan, answer: gate_pb2.AuthorizeEffectResponse) -> None:
            # Settled on another server than the one that allowed it.
            gate = gates[(plan.index + 1) % SERVERS]
            attempt_id = answer.attempt_id
            if plan.dispatch:
                await call(gate.RecordDispatch, gate_pb2.RecordDispatchRequest(attempt_id=attempt_id))
            if plan.settlement == "succeeded":
                request = succeeded(attempt_id, f"charge-{plan.index}")
                request.succeeded.usage[USD] = plan.usage
                await call(gate.RecordOutcome, request)
            elif plan.settlement == "failed":
                evidence = gate_pb2.PROVIDER_REJECTED if plan.dispatch else gate_pb2.NOT_SENT
                await call(gate.RecordOutcome, failed(attempt_id, evidence))
            elif plan.settlement == "release":
                await call(gate.ReleaseAttempt, gate_pb2.ReleaseAttemptRequest(attempt_id=attempt_id, reason="no"))
            else:
                await call(gate.RecordOutcome, unknown(attempt_id))
                await asyncio.sleep(0.01)
                reconciler = gates[(plan.index + 2) % SERVERS]
                if plan.reconcile_with_receipt:
                    evidence = {"receipt": common_pb2.Receipt(provider_reference=f"found-{plan.index}")}
                else:
                    evidence = {"not_happened": gate_pb2.ReconcileEffectRequest.NotHappened(reason="not there")}
                reconcile = gate_pb2.ReconcileEffectRequest(effect_id=answer.effect_id, **evidence)
                # "Not happened" takes an operator: the agent cannot clear its own uncertainty.
                await call(reconciler.ReconcileEffect, reconcile, as_operator="not_happened" in evidence)
            outcomes.settled.add(plan.index)

        async def one(plan: Plan) -> None:
            request = authorize_request(
                run_ids[plan.index % RUNS],
                f"charge-{plan.index}",
                tool=TOOL,
                arguments=b'{"amount":%d}' % plan.estimate,
                target=f"card:{plan.index}",
            )
            request.estimate[USD] = plan.estimate
            await asyncio.sleep(plan.delay)
            try:
                answer = await call(gates[plan.index % SERVERS].AuthorizeEffect, request)
                outcomes.answers[plan.index] = answer
                if answer.outcome == ALLOW:
                    await settle(plan, answer)
            except grpc.aio.AioRpcError as error:
                outcomes.errors.append(f"call {plan.index}: {describe(error)}")

        await asyncio.gather(*(one(plan) for plan in plans))
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return outcomes


def test_posted_plus_pending_never_exceeds_the_limit_across_three_servers(cluster):
    rng = random.Random(SEED)
    plans = make_plans(rng)
    tenant_id = cluster.tenant.name
    sampler = Sampler(cluster.url, tenant_id, cluster.budget_id)
    thread = threading.Thread(target=sampler.run, name="budget-sampler", daemon=True)

    started = time.monotonic()
    thread.start()
    try:
        outcomes = asyncio.run(storm(cluster, plans))
    finally:
        sampler.stop.set()
        thread.join(timeout=10)
    elapsed = time.monotonic() - started

    context = f"seed {SEED}"
    assert not sampler.errors, f"sampler failed: {sampler.errors[0]!r}"
    assert not outcomes.errors, f"{len(outcomes.errors)} call(s) failed ({context}): {outcomes.errors[:5]}"
    assert len(outcomes.answers) == CALLS

    # Every answer is ALLOW or a budget DENY; every ALLOW has one reservation and was settled.
    counts = Counter(common_pb2.Outcome.Name(a.outcome) for a in outcomes.answers.values())
    assert set(counts) <= {"ALLOW", "DENY"}, counts
    allowed = {i: a for i, a in outcomes.answers.items() if a.outcome == ALLOW}
    for answer in outcomes.answers.values():
        if answer.outcome == DENY:
            assert [r.code for r in answer.reasons] == ["BUDGET_EXHAUSTED"], answer.reasons
            assert USD in answer.reasons[0].message and not answer.reservation_ids
    for answer in allowed.values():
        assert len(answer.reservation_ids) == 1
    assert outcomes.settled == set(allowed)
    assert counts["ALLOW"] > 0 and counts["DENY"] > 0, counts

    # No committed state the sampler saw exceeded the limit.
    assert len(sampler.samples) >= 20, f"only {len(sampler.samples)} samples"
    over = [s for s in sampler.samples if s[0] + s[1] > s[2]]
    assert not over, f"{len(over)} of {len(sampler.samples)} samples over the limit ({context}): {over[:5]}"
    assert max(s[1] for s in sampler.samples) > 0, "the sampler never saw a reservation held"

    with psycopg.connect(psycopg_url(cluster.url)) as connection:
        posted, pending, limit = connection.execute(
            "SELECT posted, pending, limit_amount FROM budgets WHERE tenant_id = %s AND budget_id = %s",
            (tenant_id, cluster.budget_id),
        ).fetchone()
        rows = connection.execute(
            "SELECT reservation_id, attempt_id, budget_id, amount, state, posted_amount FROM reservations"
            " WHERE tenant_id = %s",
            (tenant_id,),
        ).fetchall()

    assert limit == LIMIT and posted + pending <= limit
    assert pending == sum(row[3] for row in rows if row[4] == "PENDING")
    assert not [row for row in rows if row[4] == "PENDING"], "reservations left pending after every settlement"
    assert pending == 0
    assert Counter(row[4] for row in rows).keys() <= {"POSTED", "VOIDED", "EXPIRED"}
    assert posted == sum(row[5] for row in rows if row[4] == "POSTED")
    assert all(row[5] == 0 for row in rows if row[4] != "POSTED")

    # Row by row: one reservation per ALLOW, for its estimate, ended as its settlement says.
    by_attempt = {row[1]: row for row in rows}
    assert len(by_attempt) == len(rows) == len(allowed)
    for index, answer in allowed.items():
        row = by_attempt[answer.attempt_id]
        assert row[0] == answer.reservation_ids[0] and row[2] == cluster.budget_id
        assert row[3] == plans[index].estimate
        assert (row[4], row[5]) == plans[index].expected(), (index, plans[index], context)
    assert posted == sum(plans[i].expected()[1] for i in allowed)

    settlements = Counter(plans[i].settlement for i in allowed)
    print(
        f"\n{context}: {counts['ALLOW']} ALLOW, {counts['DENY']} DENY over {SERVERS} servers in {elapsed:.1f} s;"
        f" settled {dict(settlements)}; final posted {posted} pending {pending} of {limit};"
        f" {outcomes.retries} UNAVAILABLE retries; {len(sampler.samples)} samples, max posted+pending {max(s[0] + s[1] for s in sampler.samples)}"
    )
