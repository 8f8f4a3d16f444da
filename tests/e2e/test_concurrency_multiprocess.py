"""Exactly one ALLOW per idempotency key, enforced by PostgreSQL across server processes.

Three ``effect-ledger serve`` processes share one fresh database, and storms of concurrent
AuthorizeEffect calls for one key are spread over them round-robin. No lock inside one process
can order calls that arrive at different processes: only the database can (the unique
constraint on (tenant, idempotency_key), INSERT ... ON CONFLICT DO NOTHING, and the effect row
locked FOR UPDATE). Every answer is checked, then the database itself, then the run traces.

The tests share the module's database and run in file order; the last one checks the traces
everything before it wrote.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import grpc
import psycopg
import pytest

from effect_ledger.client import error_from_rpc
from effectledger.v1 import common_pb2, gate_pb2, gate_pb2_grpc, runs_pb2, runs_pb2_grpc
from support import (
    ServerProcess,
    Tenant,
    authorize_request,
    contract,
    psycopg_url,
    servers_on_fresh_database,
    succeeded,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SERVERS = 3
CALL_TIMEOUT_SECONDS = 30.0
# Longer than the module runs: no lease may run out (and turn an attempt UNKNOWN) mid-test.
LEASE_SECONDS = 3600

STORM_CALLS = 64
STORM_ROUNDS = 25
COMPLETE_EVERY = 2  # rounds 0, 2, 4, ... complete the winning attempt during the storm

RACE_CALLS_PER_SIDE = 32
RACE_ROUNDS = 16

RETRY_CALLS = 32
RETRY_ROUNDS = 12
RETRY_MAX_ATTEMPTS = 3

REPORT_ROUNDS = 20
DISPATCH_RETRIES = 6

STATS_FLUSH_SECONDS = 1.5

MAIL = "email.send"
CHARGE = "payment.charge"
ARGS_A = b'{"to":"bob@example.com","subject":"hello"}'
ARGS_B = b'{"to":"bob@example.com","subject":"HELLO"}'

ALLOW = common_pb2.ALLOW
DENY = common_pb2.DENY
DUPLICATE = common_pb2.DUPLICATE
RECONCILE_REQUIRED = common_pb2.RECONCILE_REQUIRED


@dataclass
class Cluster:
    url: str
    servers: list[ServerProcess]
    tenant: Tenant
    # Keys each test used, so the database checks look at exactly those.
    keys: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster():
    with servers_on_fresh_database("el_mp", SERVERS) as (url, servers, tenant):
        admin = tenant.client(servers[0], "admin")
        admin.tools.PutToolContract(contract(MAIL, lease_seconds=LEASE_SECONDS))
        admin.tools.PutToolContract(
            contract(
                CHARGE,
                provider_idempotency=True,
                allowed_recovery=(common_pb2.RETRY_SAME_KEY,),
                max_attempts=RETRY_MAX_ATTEMPTS,
                lease_seconds=LEASE_SECONDS,
            )
        )
        admin.close()
        yield Cluster(url, servers, tenant)


# --- clients -----------------------------------------------------------------------------------


Result = gate_pb2.AuthorizeEffectResponse | grpc.aio.AioRpcError


class Gates:
    """One grpc.aio channel per server process, all in this test's event loop."""

    def __init__(self, cluster: Cluster) -> None:
        self.channels = [grpc.aio.insecure_channel(server.target) for server in cluster.servers]
        self.gates = [gate_pb2_grpc.GateStub(channel) for channel in self.channels]
        self.runs = [runs_pb2_grpc.RunsStub(channel) for channel in self.channels]
        self.metadata = (("authorization", f"Bearer {cluster.tenant.tokens['agent']}"),)

    async def __aenter__(self) -> Gates:
        # Connected before any storm, so connection setup does not spread the calls out.
        await asyncio.gather(*(channel.channel_ready() for channel in self.channels))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels))

    async def new_run(self) -> str:
        run = await self.runs[0].CreateRun(
            runs_pb2.CreateRunRequest(), metadata=self.metadata, timeout=CALL_TIMEOUT_SECONDS
        )
        return run.run_id

    async def authorize(self, server: int, request) -> Result:
        try:
            return await self.gates[server % SERVERS].AuthorizeEffect(
                request, metadata=self.metadata, timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            return error


async def storm(gates: Gates, requests: list, complete_reference: str | None = None) -> list[Result]:
    """Fire every request at once, request i at server i % 3; answers in request order.

    With ``complete_reference`` the first ALLOW is dispatched and recorded SUCCEEDED (on another
    server) while the storm still runs: half the calls fire at once, a quarter when the ALLOW
    answers (racing RecordDispatch), the last quarter when the dispatch answers (racing
    RecordOutcome), so later calls meet each stage of the effect.
    """
    go, allowed_seen, dispatched = asyncio.Event(), asyncio.Event(), asyncio.Event()
    allowed: asyncio.Future = asyncio.get_running_loop().create_future()
    count = len(requests)

    def release(index: int) -> asyncio.Event:
        if complete_reference is None or index < count // 2:
            return go
        return allowed_seen if index < count * 3 // 4 else dispatched

    async def one(index: int, request) -> Result:
        await release(index).wait()
        result = await gates.authorize(index, request)
        if is_allow(result) and not allowed.done():
            allowed.set_result((index, result))
        return result

    async def completer() -> None:
        index, winner = await asyncio.wait_for(allowed, CALL_TIMEOUT_SECONDS)
        allowed_seen.set()
        gate = gates.gates[(index + 1) % SERVERS]
        options = {"metadata": gates.metadata, "timeout": CALL_TIMEOUT_SECONDS}
        dispatch = gate_pb2.RecordDispatchRequest(attempt_id=winner.attempt_id)
        await gate.RecordDispatch(dispatch, **options)
        dispatched.set()
        await gate.RecordOutcome(succeeded(winner.attempt_id, complete_reference), **options)

    calls = [asyncio.ensure_future(one(index, request)) for index, request in enumerate(requests)]
    completing = asyncio.ensure_future(completer()) if complete_reference else None
    await asyncio.sleep(0)  # every call is now waiting at its barrier
    go.set()
    if completing is not None:
        await completing
    return await asyncio.gather(*calls)


def is_allow(result: Result) -> bool:
    return isinstance(result, gate_pb2.AuthorizeEffectResponse) and result.outcome == ALLOW


def describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name} {error_from_rpc(error).reason}: {error.details()}"


def answers(results: list[Result]) -> list[gate_pb2.AuthorizeEffectResponse]:
    """The responses; any failed call fails the test with its status."""
    errors = [describe(r) for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert not errors, f"{len(errors)} call(s) failed: {Counter(errors).most_common(5)}"
    return list(results)


def new_key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- database checks ---------------------------------------------------------------------------


def query(cluster: Cluster, sql: str, *params) -> list[tuple]:
    with psycopg.connect(psycopg_url(cluster.url)) as connection:
        return connection.execute(sql, params).fetchall()


def rows_per_key(cluster: Cluster, keys: list[str]) -> dict[str, tuple[int, int]]:
    """key -> (effects rows, attempts rows)."""
    found = query(
        cluster,
        """
        SELECT e.idempotency_key, count(DISTINCT e.effect_id), count(a.attempt_id)
        FROM effects e
        LEFT JOIN attempts a ON a.tenant_id = e.tenant_id AND a.effect_id = e.effect_id
        WHERE e.tenant_id = %s AND e.idempotency_key = ANY(%s)
        GROUP BY e.idempotency_key
        """,
        cluster.tenant.name,
        keys,
    )
    return {key: (effects, attempts) for key, effects, attempts in found}


def decisions_per_key(cluster: Cluster, keys: list[str]) -> dict[str, Counter]:
    """key -> Counter of decision outcomes recorded for it."""
    counted: dict[str, Counter] = {key: Counter() for key in keys}
    for key, outcome, number in query(
        cluster,
        """
        SELECT idempotency_key, outcome, count(*) FROM decisions
        WHERE tenant_id = %s AND idempotency_key = ANY(%s)
        GROUP BY idempotency_key, outcome
        """,
        cluster.tenant.name,
        keys,
    ):
        counted[key][outcome] = number
    return counted


def outcome_counts(responses: list[gate_pb2.AuthorizeEffectResponse]) -> Counter:
    return Counter(common_pb2.Outcome.Name(r.outcome) for r in responses)


# --- 1. one key, identical arguments -----------------------------------------------------------


async def test_one_key_storm_gives_exactly_one_allow(cluster):
    """64 identical calls over 3 processes: one ALLOW, every other answer names the same effect."""
    keys, seen, duplicates = [], {}, 0
    async with Gates(cluster) as gates:
        run_id = await gates.new_run()
        for round_number in range(STORM_ROUNDS):
            key = new_key(f"storm{round_number}")
            keys.append(key)
            reference = f"msg-{key}" if round_number % COMPLETE_EVERY == 0 else None
            request = authorize_request(run_id, key, tool=MAIL, arguments=ARGS_A)
            results = await storm(gates, [request] * STORM_CALLS, complete_reference=reference)
            responses = answers(results)

            allows = [r for r in responses if r.outcome == ALLOW]
            assert len(allows) == 1, f"round {round_number}: {outcome_counts(responses)}"
            winner = allows[0]
            assert winner.attempt_id and winner.provider_idempotency_key
            assert winner.attempt_number == 1
            for response in responses:
                assert response.effect_id == winner.effect_id
                assert response.intent_digest == winner.intent_digest
                if response is winner:
                    continue
                assert response.outcome in (DUPLICATE, RECONCILE_REQUIRED), response
                assert not response.attempt_id and not response.provider_idempotency_key
                if response.outcome == DUPLICATE:
                    # Only after the outcome was recorded, and always with its receipt.
                    assert reference is not None
                    assert response.effect_stage == common_pb2.SUCCEEDED
                    assert response.receipt.provider_reference == reference
                    assert len(response.receipt.digest) == 64
                else:
                    assert response.effect_stage in (common_pb2.AUTHORIZED, common_pb2.DISPATCHED)
            counts = outcome_counts(responses)
            duplicates += counts["DUPLICATE"]
            seen[key] = counts
    # The outcome was recorded while the storm still ran: later calls saw it.
    assert duplicates > 0, "no DUPLICATE answer in any completing round"
    print(
        f"answers over {STORM_ROUNDS} rounds: {dict(sum(seen.values(), Counter()))}; "
        f"DUPLICATEs per completing round: {[seen[k]['DUPLICATE'] for k in keys[::COMPLETE_EVERY]]}"
    )

    per_key = rows_per_key(cluster, keys)
    decided = decisions_per_key(cluster, keys)
    for key in keys:
        assert per_key[key] == (1, 1), f"{key}: (effects, attempts) = {per_key[key]}"
        assert decided[key]["ALLOW"] == 1
        # One decision per answered call: no unit of work that was retried left one behind.
        assert decided[key] == seen[key], (key, decided[key], seen[key])
    stages = dict(
        query(
            cluster,
            "SELECT idempotency_key, stage FROM effects WHERE tenant_id = %s AND idempotency_key = ANY(%s)",
            cluster.tenant.name,
            keys,
        )
    )
    for round_number, key in enumerate(keys):
        assert stages[key] == ("SUCCEEDED" if round_number % COMPLETE_EVERY == 0 else "AUTHORIZED")
    cluster.keys["storm"] = keys


# --- 2. one key, two intents -------------------------------------------------------------------


async def test_one_key_two_intents_one_digest_wins(cluster):
    """Two argument sets race for one key: one digest binds it, the other side is refused."""
    keys, winners = [], Counter()
    sides = {0: ARGS_A, 1: ARGS_B}
    async with Gates(cluster) as gates:
        run_id = await gates.new_run()
        for round_number in range(RACE_ROUNDS):
            key = new_key(f"race{round_number}")
            keys.append(key)
            reference = f"msg-{key}" if round_number % COMPLETE_EVERY == 0 else None
            side_of = [index % 2 for index in range(2 * RACE_CALLS_PER_SIDE)]
            requests = [authorize_request(run_id, key, tool=MAIL, arguments=sides[side]) for side in side_of]
            results = await storm(gates, requests, complete_reference=reference)

            allows = [(side, r) for side, r in zip(side_of, results, strict=False) if is_allow(r)]
            assert len(allows) == 1, f"round {round_number}: {len(allows)} ALLOWs"
            winning_side, winner = allows[0]
            winners[winning_side] += 1
            for side, result in zip(side_of, results, strict=False):
                if side == winning_side:
                    assert isinstance(result, gate_pb2.AuthorizeEffectResponse), describe(result)
                    assert result.effect_id == winner.effect_id
                    assert result.intent_digest == winner.intent_digest
                    assert result.outcome in (ALLOW, DUPLICATE, RECONCILE_REQUIRED)
                    assert result.outcome != ALLOW or result is winner
                else:
                    assert isinstance(result, grpc.aio.AioRpcError), (
                        f"the losing intent got {common_pb2.Outcome.Name(result.outcome)}"
                    )
                    assert result.code() == grpc.StatusCode.FAILED_PRECONDITION, describe(result)
                    refused = error_from_rpc(result)
                    assert refused.reason == "IDEMPOTENCY_KEY_REUSED", describe(result)
                    assert refused.metadata["effect_id"] == winner.effect_id
                    assert refused.metadata["bound_digest"] == winner.intent_digest

    winning_digests = {}
    for key, effects_rows, digest in query(
        cluster,
        """
        SELECT idempotency_key, count(*), min(intent_digest) FROM effects
        WHERE tenant_id = %s AND idempotency_key = ANY(%s) GROUP BY idempotency_key
        """,
        cluster.tenant.name,
        keys,
    ):
        assert effects_rows == 1
        winning_digests[key] = digest
    per_key = rows_per_key(cluster, keys)
    decided = decisions_per_key(cluster, keys)
    refusals = {
        key: (number, digests)
        for key, number, digests in query(
            cluster,
            """
            SELECT idempotency_key, count(*), array_agg(DISTINCT intent_digest) FROM decisions
            WHERE tenant_id = %s AND idempotency_key = ANY(%s) AND engine = 'ledger'
              AND reasons LIKE '%%IDEMPOTENCY_KEY_REUSED%%'
            GROUP BY idempotency_key
            """,
            cluster.tenant.name,
            keys,
        )
    }
    for key in keys:
        assert per_key[key] == (1, 1)
        assert decided[key]["ALLOW"] == 1
        assert sum(decided[key].values()) == 2 * RACE_CALLS_PER_SIDE
        # Every refusal is recorded, under the losing intent's digest.
        number, digests = refusals[key]
        assert number == RACE_CALLS_PER_SIDE == decided[key]["DENY"]
        assert len(digests) == 1 and digests[0] != winning_digests[key]
    cluster.keys["race"] = keys
    print(f"winning side per round: {dict(winners)}")


# --- 3. RETRY_SAME_KEY: concurrent retries up to max_attempts ----------------------------------


async def test_retry_same_key_storm_stops_at_max_attempts(cluster):
    """Under RETRY_SAME_KEY an open attempt may be retried with the same provider key.

    ledger_verdict: no effect -> NEW_EFFECT; an open effect whose contract allows RETRY_SAME_KEY
    -> NEW_ATTEMPT (reusing the open attempt's provider key) while fewer than max_attempts
    attempts exist, else RETRY_LIMIT_EXCEEDED (DENY). No attempt here ever leaves AUTHORIZED,
    and policy allows NEW_ATTEMPT, so the rules imply exactly max_attempts ALLOWs (numbers
    1..max_attempts, one provider key) and DENY RETRY_LIMIT_EXCEEDED for every other call.
    """
    keys = []
    expected = Counter({"ALLOW": RETRY_MAX_ATTEMPTS, "DENY": RETRY_CALLS - RETRY_MAX_ATTEMPTS})
    async with Gates(cluster) as gates:
        run_id = await gates.new_run()
        for round_number in range(RETRY_ROUNDS):
            key = new_key(f"retry{round_number}")
            keys.append(key)
            request = authorize_request(
                run_id,
                key,
                tool=CHARGE,
                arguments=b'{"amount":100,"currency":"EUR"}',
                target="card:4242",
            )
            responses = answers(await storm(gates, [request] * RETRY_CALLS))

            allows = sorted(filter(is_allow, responses), key=lambda r: r.attempt_number)
            counts = outcome_counts(responses)
            assert counts == expected, counts
            assert [r.attempt_number for r in allows] == list(range(1, RETRY_MAX_ATTEMPTS + 1))
            assert len({r.provider_idempotency_key for r in allows}) == 1
            assert allows[0].provider_idempotency_key == f"{allows[0].effect_id}.1"
            reused = [r.provider_key_reused for r in allows]
            assert reused == [False] + [True] * (RETRY_MAX_ATTEMPTS - 1)
            assert len({r.attempt_id for r in allows}) == RETRY_MAX_ATTEMPTS
            for response in responses:
                assert response.effect_id == allows[0].effect_id
                if response.outcome == DENY:
                    assert [reason.code for reason in response.reasons] == ["RETRY_LIMIT_EXCEEDED"]
                    assert not response.attempt_id

    attempts = query(
        cluster,
        """
        SELECT e.idempotency_key, count(DISTINCT e.effect_id),
               array_agg(a.number ORDER BY a.number), count(DISTINCT a.provider_key),
               array_agg(DISTINCT a.stage)
        FROM effects e JOIN attempts a ON a.tenant_id = e.tenant_id AND a.effect_id = e.effect_id
        WHERE e.tenant_id = %s AND e.idempotency_key = ANY(%s)
        GROUP BY e.idempotency_key
        """,
        cluster.tenant.name,
        keys,
    )
    assert len(attempts) == len(keys)
    for key, effects_rows, numbers, provider_keys, stages in attempts:
        assert (effects_rows, numbers, provider_keys, stages) == (
            1,
            list(range(1, RETRY_MAX_ATTEMPTS + 1)),
            1,
            ["AUTHORIZED"],
        ), key
    decided = decisions_per_key(cluster, keys)
    for key in keys:
        assert decided[key] == expected
    cluster.keys["retry"] = keys


# --- 4. reports racing each other ---------------------------------------------------------------


async def test_racing_reports_never_regress_a_stage(cluster):
    """RecordOutcome(succeeded) and retried RecordDispatch calls for one attempt, at once.

    Each report locks the effect row, then reads the attempts: whichever order the processes
    take, the attempt ends SUCCEEDED with its receipt, and a dispatch report that comes second
    changes nothing (it must not write the attempt back as DISPATCHED).
    """
    keys = []
    async with Gates(cluster) as gates:
        run_id = await gates.new_run()
        options = {"metadata": gates.metadata, "timeout": CALL_TIMEOUT_SECONDS}
        for round_number in range(REPORT_ROUNDS):
            key = new_key(f"report{round_number}")
            keys.append(key)
            request = authorize_request(run_id, key, tool=MAIL, arguments=ARGS_A)
            allowed = await gates.authorize(round_number, request)
            assert is_allow(allowed)
            reference = f"msg-{key}"
            dispatch = gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id)
            reports = await asyncio.gather(
                gates.gates[0].RecordOutcome(succeeded(allowed.attempt_id, reference), **options),
                *(gates.gates[1 + index % 2].RecordDispatch(dispatch, **options) for index in range(DISPATCH_RETRIES)),
            )
            outcome, dispatches = reports[0], reports[1:]
            assert outcome.changed and outcome.attempt.stage == common_pb2.SUCCEEDED
            applied = [d for d in dispatches if d.changed]
            assert len(applied) <= 1
            effect = await gates.gates[round_number % SERVERS].GetEffect(
                gate_pb2.GetEffectRequest(effect_id=allowed.effect_id), **options
            )
            stage = common_pb2.Stage.Name(effect.stage)
            assert stage == "SUCCEEDED", f"round {round_number}: the effect is {stage}"
            [attempt] = effect.attempts
            assert attempt.stage == common_pb2.SUCCEEDED
            assert attempt.receipt.provider_reference == reference
            assert attempt.finished_at.seconds > 0
            # A dispatch report either came first (and is kept) or changed nothing.
            assert (attempt.dispatched_at.seconds > 0) == bool(applied)
    cluster.keys["report"] = keys


# --- 5. the traces ------------------------------------------------------------------------------


def test_traces_are_intact_after_the_storms(cluster):
    """Every hash chain verifies, every run's events are revisions 1..N (N its head), each
    attempt's authorization is in the trace once, and PostgreSQL saw no deadlock."""
    verified = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "verify", "--database-url", cluster.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "every run's hash chain verifies" in verified.stdout

    runs = query(
        cluster,
        """
        SELECT r.tenant_id, r.run_id, r.revision, array_agg(e.revision ORDER BY e.revision)
        FROM runs r JOIN run_events e ON e.tenant_id = r.tenant_id AND e.run_id = r.run_id
        GROUP BY r.tenant_id, r.run_id, r.revision
        """,
    )
    assert len(runs) >= 3
    for tenant_id, run_id, head, revisions in runs:
        assert revisions == list(range(1, head + 1)), (tenant_id, run_id, head)
    assert query(
        cluster,
        "SELECT count(*) FROM runs r WHERE NOT EXISTS "
        "(SELECT 1 FROM run_events e WHERE e.tenant_id = r.tenant_id AND e.run_id = r.run_id)",
    ) == [(0,)]

    # Each attempt's authorization is in its run's trace exactly once, and nothing more.
    mismatched = query(
        cluster,
        """
        WITH authorized AS (
            SELECT tenant_id, payload::jsonb ->> 'attempt_id' AS attempt_id, count(*) AS events
            FROM run_events WHERE type IN ('effect.authorized', 'attempt.authorized')
            GROUP BY 1, 2
        )
        SELECT a.attempt_id, z.attempt_id, z.events
        FROM attempts a
        FULL JOIN authorized z ON z.tenant_id = a.tenant_id AND z.attempt_id = a.attempt_id
        WHERE a.attempt_id IS NULL OR z.attempt_id IS NULL OR z.events <> 1
        """,
    )
    assert mismatched == []
    if set(cluster.keys) == {"storm", "race", "retry", "report"}:  # the whole module ran and passed
        single = sum(len(cluster.keys[name]) for name in ("storm", "race", "report"))
        expected = single + RETRY_MAX_ATTEMPTS * len(cluster.keys["retry"])
        assert query(cluster, "SELECT count(*) FROM attempts") == [(expected,)]

    # A deadlock is retried inside the server and never shows in an answer: ask PostgreSQL.
    # Backends report their statistics within about a second of going idle.
    time.sleep(STATS_FLUSH_SECONDS)
    deadlocks = query(cluster, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    assert deadlocks == [(0,)]
