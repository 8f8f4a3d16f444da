"""Scheduled intents across server replicas on one PostgreSQL database: the scheduled-retry
scenario end to end, a policy change between scheduling and due time, due times that survive a
restart of every replica, and replicas killed (SIGKILL) while they fire, which never fire one
intent twice: the database moves each schedule out of SCHEDULED once."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from effectledger.v1 import budgets_pb2, checkpoints_pb2, gate_pb2, runs_pb2, schedules_pb2
from support import (
    REPO,
    ServerProcess,
    Tenant,
    authorize_request,
    checkpoints_stub,
    contract,
    create_pg_database,
    drop_pg_database,
    failed,
    migrate,
    new_run,
    new_tenant,
    outcome_name,
    psycopg_url,
    reload_policy,
    succeeded,
)

pytestmark = [pytest.mark.postgres, pytest.mark.multiprocess]

REPLICAS = 3
SCHEDULER_ARGS = ["--scheduler-interval-seconds", "0.1"]
WAIT_SECONDS = 30.0
KILLS_MIN = 4
BLOCK_BOB = """package effectledger.gate

import rego.v1

deny contains reason("BOB_IS_BLOCKED", "mail to bob is blocked since the schedule was made") if {
	input.request.target == "mailto:bob@example.com"
}
"""


@pytest.fixture
def cluster():
    """Three replicas on a fresh database, each with the shipped policy in a folder of its own
    copy (so a test can change the policy under all of them), and a tenant."""
    url = create_pg_database("el_sched")
    folder = Path(tempfile.mkdtemp(prefix="el-sched-policy-")) / "policy"
    shutil.copytree(REPO / "policy", folder)
    servers = [ServerProcess(url, [*SCHEDULER_ARGS, "--policy-dir", str(folder)]) for _ in range(REPLICAS)]
    try:
        migrate(url)
        with ThreadPoolExecutor(REPLICAS) as pool:
            list(pool.map(ServerProcess.start, servers))
        yield url, servers, folder, new_tenant(url)
    finally:
        for server in servers:
            server.stop()
        drop_pg_database(url)
        shutil.rmtree(folder.parent, ignore_errors=True)


def schedule_request(run_id: str, key: str, delay_seconds: int, **fields) -> schedules_pb2.ScheduleIntentRequest:
    return schedules_pb2.ScheduleIntentRequest(
        run_id=run_id,
        tool="email.send",
        arguments_json=b'{"to":"bob@example.com","subject":"hello"}',
        idempotency_key=key,
        target="mailto:bob@example.com",
        purpose=fields.pop("purpose", schedules_pb2.DELAYED_RETRY),
        delay_seconds=delay_seconds,
        **fields,
    )


def first_due(client, run_id: str) -> schedules_pb2.DueIntent:
    stream = client.schedules.WatchDueIntents(schedules_pb2.WatchDueIntentsRequest(run_id=run_id), timeout=WAIT_SECONDS)
    try:
        return next(iter(stream))
    finally:
        stream.cancel()


def due_events(url: str, tenant: str) -> Counter[str]:
    """How many times each schedule fired, from the runs' hash-chained traces."""
    with psycopg.connect(psycopg_url(url)) as connection:
        rows = connection.execute(
            "SELECT payload FROM run_events WHERE tenant_id = %s AND type = 'schedule.due'", (tenant,)
        ).fetchall()
    return Counter(json.loads(row[0])["schedule_id"] for row in rows)


def test_the_scheduled_retry_scenario_runs_end_to_end_on_three_replicas(cluster):
    _url, servers, _folder, tenant = cluster
    agents = [tenant.client(server, "agent") for server in servers]
    admin = tenant.client(servers[0], "admin")
    request = contract(lease_seconds=60, max_attempts=3)
    request.contract.default_estimate["usd_cents"] = 5
    admin.tools.PutToolContract(request)
    run_id = new_run(agents[0])
    admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id, dimension="usd_cents", limit=100)
    )

    # The first attempt: the provider answers 429 (a definite rejection): the effect FAILED.
    first = agents[0].gate.AuthorizeEffect(authorize_request(run_id, "retry-1"))
    agents[0].gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agents[0].gate.RecordOutcome(failed(first.attempt_id, reason="429 rate limited: retry after 2 s"))

    # The runtime schedules the retry (holding the tool's estimate) and its process goes away.
    scheduled = agents[1].schedules.ScheduleIntent(
        schedule_request(run_id, "retry-1", 2, purpose=schedules_pb2.RATE_LIMIT, hold_budget=True)
    )
    assert scheduled.effect_id == first.effect_id and dict(scheduled.reservation) == {"usd_cents": 5}
    early = agents[2].gate.AuthorizeEffect(authorize_request(run_id, "retry-1"))
    assert outcome_name(early) == "DENY" and early.reasons[0].code == "SCHEDULE_NOT_DUE"

    # Another process learns it is due from any replica, and the retry is decided then.
    due = first_due(agents[2], run_id)
    assert due.schedule.schedule_id == scheduled.schedule_id and due.schedule.state == schedules_pb2.DUE
    retry = agents[0].gate.AuthorizeEffect(authorize_request(run_id, "retry-1"))
    assert outcome_name(retry) == "ALLOW" and retry.attempt_number == 2 and retry.schedule_id == scheduled.schedule_id
    agents[0].gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=retry.attempt_id))
    agents[0].gate.RecordOutcome(succeeded(retry.attempt_id))

    done = agents[1].schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=scheduled.schedule_id))
    assert done.state == schedules_pb2.SCHEDULE_CONSUMED and done.decision_id == retry.decision_id
    budget = agents[1].budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert budget.budgets[0].pending == 0 and not budget.open_reservations  # the hold went to the attempt, then posted
    assert outcome_name(agents[2].gate.AuthorizeEffect(authorize_request(run_id, "retry-1"))) == "DUPLICATE"


def test_a_policy_change_before_the_due_time_denies_the_reconsideration(cluster):
    _url, servers, folder, tenant = cluster
    agent = tenant.client(servers[0], "agent")
    tenant.client(servers[0], "admin").tools.PutToolContract(contract())
    run_id = new_run(agent)
    scheduled = agent.schedules.ScheduleIntent(schedule_request(run_id, "later-1", 3))

    (folder / "effectledger" / "gate" / "bob.rego").write_text(BLOCK_BOB)
    for server in servers:
        reload_policy(server)

    first_due(tenant.client(servers[1], "agent"), run_id)
    denied = tenant.client(servers[2], "agent").gate.AuthorizeEffect(authorize_request(run_id, "later-1"))
    assert outcome_name(denied) == "DENY" and "BOB_IS_BLOCKED" in [r.code for r in denied.reasons]
    closed = agent.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=scheduled.schedule_id))
    assert closed.state == schedules_pb2.SCHEDULE_CONSUMED and closed.close_reason == "reconsidered: DENY"


def test_due_times_survive_a_restart_of_every_replica(cluster):
    _url, servers, _folder, tenant = cluster
    agent = tenant.client(servers[0], "agent")
    tenant.client(servers[0], "admin").tools.PutToolContract(contract())
    run_id = new_run(agent)
    scheduled = agent.schedules.ScheduleIntent(schedule_request(run_id, "restart-1", 2))
    for server in servers:
        server.kill()
    time.sleep(2.5)  # due while no replica runs: nothing in memory remembers it
    servers[1].start()
    due = first_due(tenant.client(servers[1], "agent"), run_id)
    assert due.schedule.schedule_id == scheduled.schedule_id
    assert due.schedule.due_at.ToDatetime() >= due.schedule.not_before.ToDatetime()


def test_replicas_killed_while_firing_never_fire_one_intent_twice(cluster):
    url, servers, _folder, tenant = cluster
    tenant.client(servers[0], "admin").tools.PutToolContract(contract())
    agent = tenant.client(servers[0], "agent")
    run_ids = [new_run(agent) for _ in range(4)]
    count = 60
    made = [
        agent.schedules.ScheduleIntent(schedule_request(run_ids[i % len(run_ids)], f"fire-{i}", 1 + i % 4)).schedule_id
        for i in range(count)
    ]
    chaos = random.Random(15)
    # Kills go on while the schedules fall due (one to four seconds after they were made), and
    # for at least four kills however slowly a loaded machine restarts a replica.
    deadline = time.monotonic() + 6.0
    kills = 0
    while time.monotonic() < deadline or kills < KILLS_MIN:
        victim = servers[chaos.randrange(len(servers))]
        victim.kill()
        kills += 1
        time.sleep(chaos.uniform(0.05, 0.4))
        victim.start()
    survivor = tenant.client(servers[0], "agent")
    wait_until = time.monotonic() + WAIT_SECONDS
    while True:
        states = [survivor.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=s)).state for s in made]
        if all(state == schedules_pb2.DUE for state in states):
            break
        assert time.monotonic() < wait_until, Counter(states)
        time.sleep(0.2)
    fired = due_events(url, tenant.name)
    assert set(fired) == set(made) and max(fired.values()) == 1, fired.most_common(3)
    with psycopg.connect(psycopg_url(url)) as connection:
        sequences = [
            row[0]
            for row in connection.execute(
                "SELECT due_sequence FROM schedules WHERE tenant_id = %s ORDER BY due_sequence", (tenant.name,)
            ).fetchall()
        ]
    assert sequences == list(range(1, count + 1))  # one sequence each, none skipped, none shared


def test_schedules_are_sealed_exported_and_rebuilt_by_a_resume_in_another_deployment(cluster):
    """A checkpoint names each open schedule (its next eligibility, governing clock, hold and
    cancellation conditions). A resume in the same deployment keeps the listed ones and cancels
    the unlisted ones that ask for it; another deployment that imports the archive rebuilds the
    listed ones from it when the run is resumed there."""
    _url, servers, _folder, tenant = cluster
    agent, admin = tenant.client(servers[0], "agent"), tenant.client(servers[0], "admin")
    checkpoints = checkpoints_stub(servers[0], tenant.tokens["agent"])
    held = contract()
    held.contract.default_estimate["usd_cents"] = 7
    run_id = new_run(agent)
    admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id, dimension="usd_cents", limit=100)
    )
    admin.tools.PutToolContract(held)
    resumed_cancels = [schedules_pb2.CANCEL_WHEN_RUN_RESUMED]
    kept = agent.schedules.ScheduleIntent(schedule_request(run_id, "keep-1", 4, cancel_conditions=resumed_cancels))
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(run_id=run_id, expected_revision=revision, state_json=b'{"step":1}')
    )
    listed = json.loads(sealed.ledger_json)["schedules"]
    assert [s["schedule_id"] for s in listed] == [kept.schedule_id]
    assert listed[0]["governing_clock"] == "database" and listed[0]["cancel_conditions"] == ["RUN_RESUMED"]
    assert listed[0]["next_eligibility"] and listed[0]["purpose"] == "DELAYED_RETRY"
    later = agent.schedules.ScheduleIntent(
        schedule_request(run_id, "later-2", 60, cancel_conditions=resumed_cancels, hold_budget=True)
    )
    checkpoints.RegisterCheckpoint(checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    resume = checkpoints_pb2.ResumeRunRequest(
        checkpoint_id=sealed.checkpoint_id,
        configuration=checkpoints_pb2.Configuration(provider="p", model="m2", adapter="a"),
        reason="model switch",
    )
    checkpoints.ResumeRun(resume)
    state = {
        s.schedule_id: s.state
        for s in agent.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(run_id=run_id)).schedules
    }
    assert state == {kept.schedule_id: schedules_pb2.SCHEDULED, later.schedule_id: schedules_pb2.SCHEDULE_CANCELLED}
    budget = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert budget.budgets[0].pending == 0 and not budget.open_reservations  # the cancelled one's hold is released

    archive = b"".join(
        c.data
        for c in checkpoints.ExportCheckpoint(
            checkpoints_pb2.ExportCheckpointRequest(checkpoint_id=sealed.checkpoint_id)
        )
    )
    other_url = create_pg_database("el_sched_b")
    other = ServerProcess(other_url, SCHEDULER_ARGS)
    try:
        migrate(other_url)
        other.start()
        elsewhere = Tenant(other_url, tenant.name)
        elsewhere.add("agent", "agent")
        elsewhere.add("admin", "admin")
        elsewhere.client(other, "admin").tools.PutToolContract(contract())  # no budgets there: no hold
        imported = checkpoints_stub(other, elsewhere.tokens["admin"]).ImportCheckpoint(
            iter([checkpoints_pb2.ArchiveChunk(data=archive, allow_unsigned=True)])
        )
        their_checkpoints = checkpoints_stub(other, elsewhere.tokens["agent"])
        their_checkpoints.RegisterCheckpoint(
            checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=imported.checkpoint_id)
        )
        resume.checkpoint_id = imported.checkpoint_id
        their_checkpoints.ResumeRun(resume)
        their_agent = elsewhere.client(other, "agent")
        rebuilt = their_agent.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(schedule_id=kept.schedule_id))
        assert rebuilt.state in (schedules_pb2.SCHEDULED, schedules_pb2.DUE) and rebuilt.run_id == run_id
        assert rebuilt.not_before == kept.not_before and rebuilt.intent_digest == kept.intent_digest
        first_due(their_agent, run_id)
        allowed = their_agent.gate.AuthorizeEffect(authorize_request(run_id, "keep-1"))
        assert outcome_name(allowed) == "ALLOW" and allowed.schedule_id == kept.schedule_id
    finally:
        other.stop()
        drop_pg_database(other_url)
