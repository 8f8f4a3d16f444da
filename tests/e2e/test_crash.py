"""The server SIGKILLs itself at a commit point mid-workload; the clients' history must still check.

For each crash point (``EFFECT_LEDGER_CRASH_AT=<Method>.<before_commit|after_commit>:<n>``, see
``effect_ledger/faults.py``) a server is started that kills itself the n-th time a call reaches
that point: before the commit (the database must keep nothing of the call) or after it (the
write is durable, the client never hears so). Four client threads drive sixteen effects through
AuthorizeEffect -> RecordDispatch -> (a simulated provider) -> RecordOutcome, every call recorded
in a Jepsen-style history (tests/history.py). When the server dies it stays down until every
lease open at the crash has run out (2 s), so the attempts in flight come back UNKNOWN; then it
is restarted without the crash point, and each client retries with the same keys until its
effect is settled:

- ALLOW: go on with the cycle;
- RECONCILE_REQUIRED: an attempt the client never heard of (a lost ALLOW) or never sent is
  reconciled ``not_happened``; one it sent is reconciled with what the provider answered;
- a report refused because the lease (2 s) ran out meanwhile (a dispatch refused with
  ``LEASE_EXPIRED``, an outcome refused with ``RECONCILE_REQUIRED``): reconciled the same way;
- DUPLICATE: done.

Then: the checker finds no violation (no ALLOW after SUCCEEDED, no two live attempts unless
RETRY_SAME_KEY, one intent per key, every receipt from an ALLOWed attempt, posted + pending <=
limit in every budget read, every acknowledged write present afterwards, stages only along
ALLOWED_EDGES); the simulated provider applied each effect at most once; every effect ends as its
plan says; the effects left UNKNOWN on purpose or by an expired lease are exactly the ones
ListOpenEffects shows; no reservation stays held for a settled attempt; and ``effect-ledger
verify`` passes over the database.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from history import (
    FinalEffect,
    History,
    RecordingClient,
    Result,
    check_all,
    check_final_attempts,
    final_effect,
    summarize,
)

from effect_ledger.domain.canonical import intent_digest
from effectledger.v1 import budgets_pb2, common_pb2, gate_pb2
from support import (
    ServerProcess,
    contract,
    create_pg_database,
    drop_pg_database,
    failed,
    migrate,
    new_run,
    new_tenant,
    succeeded,
    unknown,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

CRASH_ENV = "EFFECT_LEDGER_CRASH_AT"
# (point, n): n is well below the number of calls that reach the point in one workload (about
# 32 AuthorizeEffect, 20 RecordDispatch and 18 RecordOutcome), so the crash always hits, while
# the four clients are busy with their first or second effect.
CRASH_POINTS = [
    ("AuthorizeEffect.before_commit", 8),
    ("AuthorizeEffect.after_commit", 8),
    ("RecordOutcome.before_commit", 6),
    ("RecordOutcome.after_commit", 6),
    ("RecordDispatch.before_commit", 6),
    ("RecordDispatch.after_commit", 6),
]
METHOD_OPS = {"AuthorizeEffect": "authorize", "RecordOutcome": "outcome", "RecordDispatch": "dispatch"}

LEASE_SECONDS = 2
MAX_ATTEMPTS = 5
USD = "usd_micros"
ESTIMATE = {USD: 100}
BUDGET_LIMIT = 10_000
WORKERS = 4
SCENARIO_DEADLINE_SECONDS = 45.0
CALL_TIMEOUT_SECONDS = 10.0
RETRY_PAUSE_SECONDS = 0.05
DENIED_PAUSE_SECONDS = 0.1
SAMPLE_PAUSE_SECONDS = 0.05
DOWNTIME_MARGIN_SECONDS = 0.5

MAIL = "email.send"
CHARGE = "payment.charge"
SHARED_TARGET = "mailto:team@example.com"
RECEIPT_DETAIL = b'{"status":"sent"}'

# A step is what one attempt is for: apply (the provider applies it), reject (the provider says
# no), unknown (sent, no answer: reported UNKNOWN), abandon (sent, then the runtime "crashes" and
# never reports), release (given back before dispatch).
STEPS = {
    "succeed": ("apply",),
    "fail": ("reject",),
    "fail_then_succeed": ("reject", "apply"),
    "release_then_succeed": ("release", "apply"),
    "unknown": ("unknown",),
    "abandon": ("abandon",),
    "retry_same_key": ("unknown", "apply"),
}
FINAL_STAGE = {
    "succeed": "SUCCEEDED",
    "fail": "FAILED",
    "fail_then_succeed": "SUCCEEDED",
    "release_then_succeed": "SUCCEEDED",
    "unknown": "UNKNOWN",
    "abandon": "UNKNOWN",
    "retry_same_key": "SUCCEEDED",
}
LEFT_OPEN = {"unknown", "abandon"}
WORKER_PLANS = [
    ("succeed", "fail", "fail_then_succeed", "unknown"),
    ("succeed", "release_then_succeed", "abandon", "retry_same_key"),
] * (WORKERS // 2)


@pytest.fixture(scope="module")
def database_url():
    url = create_pg_database("el_crash")
    try:
        migrate(url)
        yield url
    finally:
        drop_pg_database(url)


# --- the simulated provider ----------------------------------------------------------------------


class Provider:
    """Applies a request at most once per provider idempotency key, and remembers the truth."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.applied: dict[str, str] = {}  # provider key -> reference
        self.applied_keys: dict[str, set[str]] = defaultdict(set)  # idempotency key -> provider keys

    def send(self, key: str, provider_key: str, step: str) -> str | None:
        with self.lock:
            if step == "reject":
                assert provider_key not in self.applied, "the flows never reject after applying"
                return None
            self.applied_keys[key].add(provider_key)
            return self.applied.setdefault(provider_key, f"ref-{provider_key}")


# --- the clients ---------------------------------------------------------------------------------


@dataclass
class Plan:
    name: str
    key: str
    tool: str
    target: str
    arguments: bytes
    digest: str
    run_id: str
    effect_id: str = ""
    done_steps: int = 0
    settled: bool = False
    receipt: str = ""  # the provider reference the effect succeeded with
    duplicate_receipt: str = ""
    sent: dict[str, str] = field(default_factory=dict)  # attempt id -> step it was sent for
    references: dict[str, str] = field(default_factory=dict)  # attempt id -> provider reference
    denied_for_target: int = 0

    @property
    def steps(self) -> tuple[str, ...]:
        return STEPS[self.name]

    @property
    def step(self) -> str:
        return self.steps[self.done_steps]

    @property
    def finished(self) -> bool:
        return self.done_steps == len(self.steps)

    def advance(self) -> None:
        self.done_steps += 1
        if self.finished and self.steps[-1] != "apply":
            self.settled = True  # an applied effect is settled by the DUPLICATE that confirms it

    def request(self) -> gate_pb2.AuthorizeEffectRequest:
        return gate_pb2.AuthorizeEffectRequest(
            run_id=self.run_id,
            tool=self.tool,
            arguments_json=self.arguments,
            idempotency_key=self.key,
            target=self.target,
        )

    @property
    def tag(self) -> dict[str, str]:
        return {"key": self.key, "tool": self.tool, "effect_id": self.effect_id}


class Stop(Exception):
    """A plan cannot go on as the rules say it should: reported, and the test fails."""


def stage_of(result: Result) -> str:
    response = result.response
    if isinstance(response, gate_pb2.AttemptResponse):
        return common_pb2.Stage.Name(response.attempt.stage)
    return common_pb2.Stage.Name(response.stage)


class Worker:
    """One agent runtime: drives its plans one after another, retrying until each is settled."""

    def __init__(
        self, client: RecordingClient, plans: list[Plan], provider: Provider, deadline: float, abort: threading.Event
    ) -> None:
        self.client = client
        self.plans = plans
        self.provider = provider
        self.deadline = deadline
        self.abort = abort
        self.surprises: list[str] = []

    def run(self) -> None:
        for plan in self.plans:
            try:
                self.drive(plan)
            except Stop as stop:
                self.surprises.append(f"{plan.key} ({plan.name}, step {plan.done_steps}): {stop}")

    def definite(self, call) -> Result:
        """Repeat a call until it has a definite answer; after a lost one, wait for the server."""
        wait = False
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or self.abort.is_set():
                raise Stop("no definite answer before the deadline")
            result = call(wait_for_ready=wait, timeout=min(remaining, CALL_TIMEOUT_SECONDS * (3 if wait else 1)))
            if result.type != "info":
                return result
            wait = True
            time.sleep(RETRY_PAUSE_SECONDS)

    def drive(self, plan: Plan) -> None:
        while not plan.settled:
            answer = self.definite(
                lambda **kw: self.client.authorize(plan.request(), digest=plan.digest, estimate=ESTIMATE, **kw)
            )
            if answer.type == "fail":
                raise Stop(f"AuthorizeEffect refused: {answer.error}")
            response = answer.response
            if plan.effect_id and response.effect_id and response.effect_id != plan.effect_id:
                raise Stop(f"the key moved from effect {plan.effect_id} to {response.effect_id}")
            plan.effect_id = plan.effect_id or response.effect_id
            outcome = common_pb2.Outcome.Name(response.outcome)
            reasons = [reason.code for reason in response.reasons]
            if outcome == "ALLOW":
                if plan.finished:
                    self.definite(lambda **kw: self.client.release(response.attempt_id, "unexpected", **plan.tag, **kw))  # noqa: B023 - called at once
                    raise Stop("ALLOW after the effect succeeded")
                self.attempt(plan, response)
            elif outcome == "DUPLICATE":
                if not plan.finished:
                    raise Stop("DUPLICATE before the effect succeeded")
                plan.duplicate_receipt = response.receipt.provider_reference
                plan.settled = True
            elif outcome == "RECONCILE_REQUIRED":
                self.reconcile_open(plan)
            elif outcome == "DENY" and reasons and set(reasons) == {"TARGET_HAS_UNKNOWN_EFFECT"}:
                # Other clients' effects on the shared target are UNKNOWN for a moment (their
                # leases ran out while the server was down; one reason names each): those
                # clients reconcile them; ask again.
                plan.denied_for_target += 1
                time.sleep(DENIED_PAUSE_SECONDS)
            else:
                raise Stop(f"AuthorizeEffect answered {outcome} {reasons}")

    def attempt(self, plan: Plan, allowed: gate_pb2.AuthorizeEffectResponse) -> None:
        step, attempt_id = plan.step, allowed.attempt_id
        same_key = plan.tool == CHARGE
        if step == "release":
            released = self.definite(lambda **kw: self.client.release(attempt_id, "another route", **plan.tag, **kw))
            if released.type == "ok" and stage_of(released) == "RELEASED":
                plan.advance()
            elif released.reason == "ATTEMPT_NOT_RELEASABLE" and not same_key:
                # The lease ran out first (UNKNOWN): it was never sent, which is what it settles to.
                self.settle(plan, None)
                plan.advance()
            else:
                raise Stop(f"ReleaseAttempt: {released.error or stage_of(released)}")
            return
        dispatched = self.definite(lambda **kw: self.client.dispatch(attempt_id, **plan.tag, **kw))
        if dispatched.type == "fail" and dispatched.reason == "LEASE_EXPIRED":
            # The lease ran out before the dispatch was recorded (the attempt is UNKNOWN now):
            # never send it. Under RETRY_SAME_KEY the next ALLOW reuses the provider key; else
            # this runtime, its owner, settles it: it knows it never sent it.
            if not same_key:
                self.settle(plan, None)
            return
        if dispatched.type == "fail":
            raise Stop(f"RecordDispatch refused: {dispatched.error}")
        if stage_of(dispatched) != "DISPATCHED":
            raise Stop(f"RecordDispatch answered {stage_of(dispatched)}")
        reference = self.provider.send(plan.key, allowed.provider_idempotency_key, step)
        plan.sent[attempt_id] = step
        if reference is not None:
            plan.references[attempt_id] = reference
        if step == "abandon":
            plan.advance()
            return
        request = {
            "apply": lambda: succeeded(attempt_id, reference, RECEIPT_DETAIL),
            "reject": lambda: failed(attempt_id, gate_pb2.PROVIDER_REJECTED, "the provider answered 422"),
            "unknown": lambda: unknown(attempt_id, "the provider call timed out"),
        }[step]()
        reported = self.definite(lambda **kw: self.client.outcome(request, **plan.tag, **kw))
        expected = {"apply": "SUCCEEDED", "reject": "FAILED", "unknown": "UNKNOWN"}[step]
        if reported.type == "ok":
            if stage_of(reported) != expected:
                raise Stop(f"RecordOutcome({expected}) answered {stage_of(reported)}")
        elif reported.reason == "RECONCILE_REQUIRED":
            # The lease ran out before the report landed: the attempt is UNKNOWN; settle it with
            # what the provider said (an unknown one is UNKNOWN already, as it would be reported).
            if step == "apply":
                self.settle(plan, reference)
            elif step == "reject":
                self.settle(plan, None)
        else:
            raise Stop(f"RecordOutcome refused: {reported.error}")
        if step == "apply":
            plan.receipt = reference or ""
        plan.advance()

    def settle(self, plan: Plan, reference: str | None) -> None:
        if reference is not None:
            evidence = {"receipt": common_pb2.Receipt(provider_reference=reference, detail_json=RECEIPT_DETAIL)}
        else:
            evidence = {
                "not_happened": gate_pb2.ReconcileEffectRequest.NotHappened(
                    reason="the runtime never sent it, or the provider rejected it",
                    lookup_reference=f"lookup-{plan.key}",
                    lookup_result_json=b'{"found":false}',
                )
            }
        request = gate_pb2.ReconcileEffectRequest(effect_id=plan.effect_id, **evidence)
        settled = self.definite(lambda **kw: self.client.reconcile(request, key=plan.key, tool=plan.tool, **kw))
        expected = "SUCCEEDED" if reference is not None else "FAILED"
        if settled.type != "ok" or stage_of(settled) != expected:
            raise Stop(f"ReconcileEffect({expected}): {settled.error or stage_of(settled)}")

    def reconcile_open(self, plan: Plan) -> None:
        """RECONCILE_REQUIRED: settle the open attempt with what this runtime knows of it."""
        read = self.definite(lambda **kw: self.client.get_effect(plan.effect_id, key=plan.key, tool=plan.tool, **kw))
        if read.type != "ok":
            raise Stop(f"GetEffect: {read.error}")
        open_attempts = [
            a.attempt_id
            for a in read.response.attempts
            if common_pb2.Stage.Name(a.stage) in ("AUTHORIZED", "DISPATCHED", "UNKNOWN")
        ]
        if not open_attempts:
            return  # settled meanwhile: ask again
        if plan.finished:
            # The effect was acknowledged SUCCEEDED and is open again: reconciling would paper
            # over a lost write. Leave it as it is for the checker and the final read.
            raise Stop(f"RECONCILE_REQUIRED after the effect was acknowledged SUCCEEDED: {open_attempts}")
        sent = {plan.sent[a] for a in open_attempts if a in plan.sent}
        if sent - {"apply", "reject"}:
            raise Stop(f"an attempt whose outcome this runtime does not know is open: {sent}")
        applied = [plan.references[a] for a in open_attempts if plan.sent.get(a) == "apply"]
        self.settle(plan, applied[0] if applied else None)
        if applied and plan.step == "apply":
            plan.receipt = applied[0]
            plan.advance()
        elif sent == {"reject"} and plan.step == "reject":
            plan.advance()
        # Otherwise the open attempt was one this runtime never heard of (its ALLOW was lost) or
        # never sent: it is FAILED now, and the same step goes on with a new attempt.


class Sampler:
    """Reads the tenant's budget over and over while the workload runs."""

    def __init__(self, client: RecordingClient, deadline: float) -> None:
        self.client = client
        self.deadline = deadline
        self.stop = threading.Event()
        self.samples = 0

    def run(self) -> None:
        wait = False
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            result = self.client.get_budget(budgets_pb2.TENANT, wait_for_ready=wait, timeout=2.0)
            self.samples += result.type == "ok"
            wait = result.type == "info"
            time.sleep(SAMPLE_PAUSE_SECONDS)


# --- one scenario ------------------------------------------------------------------------------


def tool_contracts():
    # QUERY_THEN_RETRY: a runtime that asked the provider settles "not happened" itself, with
    # the lookup as evidence.
    mail = contract(
        MAIL,
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=LEASE_SECONDS,
        queryable=True,
        allowed_recovery=(common_pb2.QUERY_THEN_RETRY,),
    )
    charge = contract(
        CHARGE,
        allowed_recovery=(common_pb2.RETRY_SAME_KEY, common_pb2.QUERY_THEN_RETRY),
        queryable=True,
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=LEASE_SECONDS,
    )
    for request in (mail, charge):
        request.contract.default_estimate[USD] = ESTIMATE[USD]
    return mail, charge


def make_plan(name: str, key: str, run_id: str, revisions: dict[str, int], number: int) -> Plan:
    if name == "retry_same_key":
        tool, target, arguments = CHARGE, f"card:{key}", {"amount": 100 + number, "currency": "EUR"}
    else:
        tool, arguments = MAIL, {"to": "team@example.com", "subject": f"update {number}"}
        # Effects that end UNKNOWN get targets of their own: an UNKNOWN effect blocks new
        # effects of the tool on its target (TARGET_HAS_UNKNOWN_EFFECT) until reconciled.
        target = SHARED_TARGET if name in ("succeed", "fail") else f"mailto:{key}@example.com"
    digest = intent_digest(tool=tool, tool_revision=revisions[tool], target=target, arguments=arguments)
    raw = json.dumps(arguments, separators=(",", ":")).encode()
    return Plan(name, key, tool, target, raw, digest, run_id)


@dataclass
class ScenarioResult:
    history: History
    plans: list[Plan]
    provider: Provider
    final: dict[str, FinalEffect]
    contracts: dict[str, list[str]]
    crash_codes: list[int]
    surprises: list[str]
    open_seen: dict[str, dict[str, str]]  # run id -> effect id -> stage, after the restart
    open_reservations: list[dict]
    samples: int
    restart_seconds: float
    seconds: float
    server_log: str


def run_scenario(database_url: str, point: str, crash_after: int) -> ScenarioResult:
    started = time.monotonic()
    tenant = new_tenant(database_url)
    history = History()
    provider = Provider()
    server = ServerProcess(
        database_url, ["--lease-sweep-interval-seconds", "0.2"], env={CRASH_ENV: f"{point}:{crash_after}"}
    ).start()
    clients: list[RecordingClient] = []
    try:
        with tenant.client(server, "admin") as admin:
            written = [admin.tools.PutToolContract(request) for request in tool_contracts()]
            admin.budgets.PutBudget(
                budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension=USD, limit=BUDGET_LIMIT)
            )
        revisions = {c.tool: c.revision for c in written}
        contracts = {c.tool: [common_pb2.Recovery.Name(r) for r in c.allowed_recovery] for c in written}
        deadline = time.monotonic() + SCENARIO_DEADLINE_SECONDS
        abort = threading.Event()
        tag = uuid.uuid4().hex[:8]
        workers, plans = [], []
        with tenant.client(server, "agent") as agent:
            run_ids = [new_run(agent) for _ in range(WORKERS)]
        for number, (run_id, names) in enumerate(zip(run_ids, WORKER_PLANS, strict=False)):
            client = RecordingClient(
                history,
                f"w{number}",
                tenant.name,
                server.target,
                tenant.tokens["agent"],
                timeout_seconds=CALL_TIMEOUT_SECONDS,
            )
            clients.append(client)
            own = [
                make_plan(name, f"{tag}-w{number}-{index}-{name}", run_id, revisions, 10 * number + index)
                for index, name in enumerate(names)
            ]
            plans += own
            workers.append(Worker(client, own, provider, deadline, abort))
        sampler_client = RecordingClient(history, "budget", tenant.name, server.target, tenant.tokens["auditor"])
        clients.append(sampler_client)
        sampler = Sampler(sampler_client, deadline)

        crash_codes: list[int] = []
        restart_seconds = 0.0
        with ThreadPoolExecutor(WORKERS + 1) as pool:
            running = [pool.submit(worker.run) for worker in workers]
            sampling = pool.submit(sampler.run)
            try:
                while not all(future.done() for future in running):
                    code = server.process.poll()
                    if code is not None:
                        crash_codes.append(code)
                        began = time.monotonic()
                        # Stay down until every lease open at the crash has run out: the attempts
                        # in flight come back UNKNOWN, and the clients must reconcile them.
                        time.sleep(LEASE_SECONDS + DOWNTIME_MARGIN_SECONDS)
                        server.env = {}  # no crash point from now on
                        server.restart()
                        restart_seconds = time.monotonic() - began
                    time.sleep(0.02)
            except BaseException:
                abort.set()
                raise
            finally:
                sampler.stop.set()
            for future in [*running, sampling]:
                future.result()

        checker = RecordingClient(history, "checker", tenant.name, server.target, tenant.tokens["auditor"])
        clients.append(checker)
        open_seen = wait_for_open_effects(checker, plans, deadline)
        final = {}
        for effect_id in sorted({p.effect_id for p in plans if p.effect_id} | effect_ids_in(history)):
            read = checker.get_effect(effect_id, timeout=CALL_TIMEOUT_SECONDS)
            assert read.type == "ok", read.error
            final[effect_id] = final_effect(tenant.name, read.response)
        budget = checker.get_budget(budgets_pb2.TENANT)
        assert budget.type == "ok", budget.error
        return ScenarioResult(
            history=history,
            plans=plans,
            provider=provider,
            final=final,
            contracts=contracts,
            crash_codes=crash_codes,
            surprises=[s for worker in workers for s in worker.surprises],
            open_seen=open_seen,
            open_reservations=budget.op.value["open_reservations"],
            samples=sampler.samples,
            restart_seconds=restart_seconds,
            seconds=time.monotonic() - started,
            server_log=server.log(),
        )
    finally:
        for client in clients:
            client.close()
        server.stop()


def effect_ids_in(history: History) -> set[str]:
    return {op.effect_id for op in history.ops if op.effect_id and op.type == "ok"}


def wait_for_open_effects(client: RecordingClient, plans: list[Plan], deadline: float) -> dict[str, dict[str, str]]:
    """ListOpenEffects per run, until the abandoned effects' leases have run out (bounded)."""
    expected = defaultdict(set)
    for plan in plans:
        if plan.name in LEFT_OPEN:
            expected[plan.run_id].add(plan.effect_id)
    until = min(deadline, time.monotonic() + LEASE_SECONDS + 10)
    while True:
        seen: dict[str, dict[str, str]] = {}
        for run_id in sorted({plan.run_id for plan in plans}):
            listed = client.list_open_effects(run_id, timeout=CALL_TIMEOUT_SECONDS)
            assert listed.type == "ok", listed.error
            assert not listed.response.next_page_token
            seen[run_id] = dict(listed.op.value["effects"])
        settled = all(set(seen[run]) == expected[run] and set(seen[run].values()) <= {"UNKNOWN"} for run in seen)
        if settled or time.monotonic() > until:
            return seen
        time.sleep(0.1)


# --- the test ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("point", "crash_after"), CRASH_POINTS, ids=[p for p, _ in CRASH_POINTS])
def test_a_crash_at_a_commit_point_loses_nothing_acknowledged_and_allows_nothing_twice(
    database_url, point, crash_after
):
    outcome = run_scenario(database_url, point, crash_after)
    history, final, plans = outcome.history, outcome.final, outcome.plans
    method = METHOD_OPS[point.split(".")[0]]

    def explain(message: str) -> str:
        folder = Path(tempfile.mkdtemp(prefix="el-crash-history-"))
        (folder / "history.jsonl").write_text(outcome.history.to_json_lines())
        return (
            f"{message}\nhistory: {folder / 'history.jsonl'}\nlast ops:\n{history.format(last=40)}\n"
            f"server log:\n{outcome.server_log[-1500:]}"
        )

    # The server died at the crash point, once, mid-workload; the call that hit it was lost.
    assert outcome.crash_codes == [-signal.SIGKILL], explain(f"server exits: {outcome.crash_codes}")
    lost = [op for op in history.ops if op.type == "info" and op.f == method]
    assert lost, explain(f"no indeterminate {method} call: the crash did not hit a call")

    # The history checks.
    violations = check_all(history, contracts=outcome.contracts, final=final, budget_limits={USD: BUDGET_LIMIT})
    assert violations == [], explain(summarize(violations))
    assert check_final_attempts(final, outcome.contracts, history) == []
    assert outcome.samples > 0
    assert not outcome.surprises, explain("\n".join(outcome.surprises))

    # Every effect ends as its plan says, and the provider applied each at most once.
    for plan in plans:
        effect = final[plan.effect_id]
        assert effect.key == plan.key and effect.intent_digest == plan.digest
        assert effect.stage == FINAL_STAGE[plan.name], explain(f"{plan.key}: {effect}")
        applied = outcome.provider.applied_keys.get(plan.key, set())
        assert len(applied) <= 1, explain(f"{plan.key}: the provider applied it under {applied}")
        if effect.stage == "SUCCEEDED":
            assert len(applied) == 1 and effect.receipt == plan.receipt == plan.duplicate_receipt, explain(
                f"{plan.key}: receipt {effect.receipt!r}, sent {plan.receipt!r}, DUPLICATE {plan.duplicate_receipt!r}"
            )
        if effect.stage == "FAILED":
            assert not applied, explain(f"{plan.key}: FAILED, but the provider applied it")
        if plan.tool != CHARGE:
            live = [a for a in effect.attempts if a.stage not in ("FAILED", "RELEASED")]
            assert len(live) <= 1, explain(f"{plan.key}: {effect}")

    # After the restart, exactly the effects left UNKNOWN (on purpose, or by an expired lease
    # after an abandoned dispatch) are open, and they show UNKNOWN.
    expected_open = {plan.effect_id: "UNKNOWN" for plan in plans if plan.name in LEFT_OPEN}
    seen_open = {effect_id: stage for run in outcome.open_seen.values() for effect_id, stage in run.items()}
    assert seen_open == expected_open, explain(f"ListOpenEffects: {seen_open}, expected {expected_open}")

    # Money is held only for attempts that are still open.
    open_attempts = {
        a.attempt_id for e in final.values() for a in e.attempts if a.stage in ("AUTHORIZED", "DISPATCHED", "UNKNOWN")
    }
    held = {r["attempt_id"] for r in outcome.open_reservations}
    assert held <= open_attempts, explain(f"reservations held for settled attempts: {held - open_attempts}")

    verified = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "verify", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr

    counts = Counter(op.type for op in history.ops)
    attempts = sum(len(e.attempts) for e in final.values())
    answers = Counter(op.outcome for op in history.ops if op.type == "ok" and op.f == "authorize")
    reconciled = Counter(op.outcome for op in history.ops if op.type == "ok" and op.f == "reconcile")
    print(
        f"\n{point}:{crash_after}: {len(history.ops)} ops (ok {counts['ok']}, fail {counts['fail']}, "
        f"info {counts['info']}; {len(lost)} lost {method}); {len(plans)} effects, {attempts} attempts; "
        f"answers {dict(answers)}; reconciled {dict(reconciled)}; {outcome.samples} budget samples; "
        f"down {outcome.restart_seconds:.1f} s, scenario {outcome.seconds:.1f} s"
    )
