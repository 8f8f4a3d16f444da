"""``serve --workers N``: N server processes on one port under a supervisor (transport/workers.py).

Real supervisors and workers on a fresh PostgreSQL database, real channels. Which worker took a
connection is read from /proc: the supervisor's children are the workers (``--worker-index`` in
their command lines), and a worker owns the server side of each TCP connection it accepted (a
socket inode in /proc/<pid>/fd that /proc/net/tcp lists as ESTABLISHED on the server's port).
Every channel here opens a connection of its own (``grpc.use_local_subchannel_pool``) and makes
a call on it, so a worker that owns one of those connections answered one of those calls.

The tests on the module's two-worker server run in file order: after the calls, SIGHUP, then
a worker killed and replaced, then SIGTERM for them all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from effect_ledger.cli import build_parser
from effect_ledger.policy.embedded import load_engine
from effect_ledger.policy.engine import default_policy_dir
from effect_ledger.transport.workers import (
    RESTARTS_MAX,
    STOP_MARGIN_SECONDS,
    Supervisor,
    default_worker_count,
)
from effectledger.v1 import common_pb2, gate_pb2_grpc, runs_pb2, runs_pb2_grpc
from support import (
    ServerProcess,
    Tenant,
    authorize_request,
    contract,
    create_pg_database,
    drop_pg_database,
    migrate,
    new_tenant,
    psycopg_url,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

WORKERS = 2
CHANNELS = 16
CALL_TIMEOUT_SECONDS = 30.0
# ServerProcess starts every server with --grace-seconds 1; the supervisor kills a worker that
# takes longer than that and a margin.
GRACE_SECONDS = 1.0
STOP_WITHIN_SECONDS = GRACE_SECONDS + STOP_MARGIN_SECONDS
REPLACEMENT_WITHIN_SECONDS = 30.0
MAIL = "email.send"
# A tool whose leases run out at once: only the lease sweeper records that (no reads are made).
SHORT_LEASE_TOOL = "sms.send"
SWEEP_INTERVAL_SECONDS = 0.2
TCP_ESTABLISHED = "01"


# --- processes and connections, from /proc ---------------------------------------------------


def worker_pids(supervisor_pid: int) -> dict[int, int]:
    """worker index -> pid, for the supervisor's live children."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open(f"/proc/{name}/stat").read()
            arguments = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) != supervisor_pid or state == "Z" or b"--worker-index" not in arguments:
            continue
        found[int(arguments[arguments.index(b"--worker-index") + 1])] = int(name)
    return found


def process_state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def server_connections(pids: dict[int, int], port: int) -> dict[int, set[str]]:
    """worker index -> inodes of the established connections it accepted on ``port``."""
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == TCP_ESTABLISHED:
                    established.add(fields[9])
    owned = {}
    for index, pid in pids.items():
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        owned[index] = inodes & established
    return owned


def accepted_since(before: dict[int, set[str]], server: ServerProcess, pids: dict[int, int]):
    """worker index -> how many connections it accepted since ``before`` (still open)."""
    now = server_connections(pids, server.port)
    return {index: len(now[index] - before[index]) for index in pids}


@contextlib.contextmanager
def separate_channels(server: ServerProcess, count: int):
    """``count`` channels, each with a connection of its own (no shared subchannel pool)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(server.target, options=options) for _ in range(count)]
    try:
        yield channels
    finally:
        for channel in channels:
            channel.close()


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def authorize_concurrently(channels, token: str, requests) -> list:
    """One AuthorizeEffect per channel, all released at once."""
    barrier = threading.Barrier(len(channels))

    def call(pair):
        channel, request = pair
        stub = gate_pb2_grpc.GateStub(channel)
        barrier.wait(timeout=CALL_TIMEOUT_SECONDS)
        return stub.AuthorizeEffect(request, metadata=bearer(token), timeout=CALL_TIMEOUT_SECONDS)

    with ThreadPoolExecutor(len(channels)) as pool:
        return list(pool.map(call, zip(channels, requests, strict=False)))


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def new_key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the module's two-worker server ------------------------------------------------------------


@dataclass
class Cluster:
    url: str
    server: ServerProcess
    tenant: Tenant
    run_id: str
    policy_folder: Path


@pytest.fixture(scope="module")
def database():
    url = create_pg_database("el_workers")
    try:
        migrate(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="module")
def cluster(database, tmp_path_factory):
    policy_folder = tmp_path_factory.mktemp("policy") / "policy"
    shutil.copytree(default_policy_dir(), policy_folder)
    server = ServerProcess(
        database,
        ["--policy-dir", str(policy_folder), "--lease-sweep-interval-seconds", str(SWEEP_INTERVAL_SECONDS)],
        workers=WORKERS,
    ).start()
    try:
        tenant = new_tenant(database)
        with contextlib.closing(tenant.client(server, "admin")) as admin:
            admin.tools.PutToolContract(contract(MAIL, lease_seconds=3600))
            admin.tools.PutToolContract(contract(SHORT_LEASE_TOOL, lease_seconds=1))
        with contextlib.closing(tenant.client(server, "agent")) as agent:
            run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        yield Cluster(database, server, tenant, run_id, policy_folder)
    finally:
        server.stop()


def test_two_workers_share_one_port_and_both_answer_calls(cluster):
    server = cluster.server
    pids = worker_pids(server.process.pid)
    assert sorted(pids) == [0, 1] and len(set(pids.values())) == WORKERS
    log = server.full_log()
    for index, pid in pids.items():
        assert f"[worker {index} pid {pid}]" in log
    before = server_connections(pids, server.port)
    with separate_channels(server, CHANNELS) as channels:
        for channel in channels:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            run = runs_pb2_grpc.RunsStub(channel).CreateRun(
                runs_pb2.CreateRunRequest(), metadata=bearer(cluster.tenant.tokens["agent"]), timeout=10
            )
            assert run.run_id
        accepted = accepted_since(before, server, pids)
    assert sum(accepted.values()) == CHANNELS, accepted
    assert all(accepted[index] > 0 for index in pids), accepted


@pytest.mark.parametrize("round_number", range(3))
def test_exactly_one_allow_among_16_concurrent_calls_spread_over_both_workers(cluster, round_number):
    server = cluster.server
    pids = worker_pids(server.process.pid)
    key = new_key(f"one-allow-{round_number}")
    requests = [authorize_request(cluster.run_id, key, tool=MAIL)] * CHANNELS
    before = server_connections(pids, server.port)
    with separate_channels(server, CHANNELS) as channels:
        responses = authorize_concurrently(channels, cluster.tenant.tokens["agent"], requests)
        accepted = accepted_since(before, server, pids)
    outcomes = [common_pb2.Outcome.Name(response.outcome) for response in responses]
    assert outcomes.count("ALLOW") == 1, outcomes
    assert set(outcomes) == {"ALLOW", "RECONCILE_REQUIRED"}, outcomes
    assert all(accepted[index] > 0 for index in pids), accepted
    with psycopg.connect(psycopg_url(cluster.url)) as connection:
        effects, attempts = connection.execute(
            "SELECT count(DISTINCT e.effect_id), count(a.attempt_id) FROM effects e "
            "LEFT JOIN attempts a ON a.tenant_id = e.tenant_id AND a.effect_id = e.effect_id "
            "WHERE e.tenant_id = %s AND e.idempotency_key = %s",
            (cluster.tenant.name, key),
        ).fetchone()
    assert (effects, attempts) == (1, 1)


def test_sighup_reloads_the_policy_in_every_worker_and_stops_none(cluster):
    server = cluster.server
    pids = worker_pids(server.process.pid)
    token = cluster.tenant.tokens["agent"]
    with separate_channels(server, 1) as (channel,):
        before = gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
            authorize_request(cluster.run_id, new_key("before")), metadata=bearer(token), timeout=10
        )
    gate_rego = cluster.policy_folder / "effectledger" / "gate" / "gate.rego"
    gate_rego.write_text(gate_rego.read_text() + "\n# reloaded on SIGHUP\n")
    revision = load_engine(cluster.policy_folder)[1]
    assert revision != before.policy_revision
    server.process.send_signal(signal.SIGHUP)
    for index, pid in pids.items():
        line = f"[worker {index} pid {pid}] effect_ledger.policy.embedded policy reloaded, revision {revision}"
        wait_for(lambda line=line: line in server.full_log(), 10, f"worker {index} reloads")
    assert worker_pids(server.process.pid) == pids
    requests = [authorize_request(cluster.run_id, new_key(f"after-{n}")) for n in range(CHANNELS)]
    before = server_connections(pids, server.port)
    with separate_channels(server, CHANNELS) as channels:
        responses = authorize_concurrently(channels, token, requests)
        accepted = accepted_since(before, server, pids)
    assert {response.policy_revision for response in responses} == {revision}
    assert all(accepted[index] > 0 for index in pids), accepted
    assert worker_pids(server.process.pid) == pids


def test_a_killed_worker_is_replaced_and_its_replacement_sweeps_leases(cluster):
    server = cluster.server
    token = cluster.tenant.tokens["agent"]
    pids = worker_pids(server.process.pid)
    os.kill(pids[0], signal.SIGKILL)
    # Reaped by the supervisor: every thread has exited and the listening socket is closed. (A
    # zombie is not enough: its main thread can be one while other threads still hold the socket,
    # which resets the connections queued on it.)
    wait_for(lambda: process_state(pids[0]) == "gone", 10, "the killed worker is reaped")
    # The port keeps serving meanwhile: worker 1 takes the new connections.
    with separate_channels(server, 4) as channels:
        for channel in channels:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING

    def replacement_serving() -> dict[int, int] | None:
        current = worker_pids(server.process.pid)
        if current.get(0) in (None, pids[0]):
            return None
        line = f"worker 0 (pid {current[0]}) serving on port {server.port}, running the lease sweeper"
        return current if line in server.full_log() else None

    replaced = wait_for(replacement_serving, REPLACEMENT_WITHIN_SECONDS, "a new worker 0 serves")
    assert replaced[1] == pids[1]
    log = server.full_log()
    assert f"worker 0 (pid {pids[0]}) exited with signal SIGKILL" in log
    assert f"worker 1 (pid {pids[1]}) serving on port {server.port}\n" in log  # no sweeper there
    requests = [authorize_request(cluster.run_id, new_key(f"replaced-{n}")) for n in range(CHANNELS)]
    before = server_connections(replaced, server.port)
    with separate_channels(server, CHANNELS) as channels:
        responses = authorize_concurrently(channels, token, requests)
        accepted = accepted_since(before, server, replaced)
    assert {common_pb2.Outcome.Name(response.outcome) for response in responses} == {"ALLOW"}
    assert all(accepted[index] > 0 for index in replaced), accepted
    # A lease that runs out with nobody reading it is recorded by the one sweeper: the new worker 0's.
    with separate_channels(server, 1) as (channel,):
        short = gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
            authorize_request(cluster.run_id, new_key("short"), tool=SHORT_LEASE_TOOL),
            metadata=bearer(token),
            timeout=10,
        )
    assert short.outcome == common_pb2.ALLOW

    def swept() -> bool:
        with psycopg.connect(psycopg_url(cluster.url)) as connection:
            return (
                connection.execute(
                    "SELECT count(*) FROM run_events WHERE tenant_id = %s AND run_id = %s "
                    "AND type = 'attempt.lease_expired' AND principal_id = 'system:lease-sweeper' "
                    "AND payload LIKE %s",
                    (cluster.tenant.name, cluster.run_id, f"%{short.attempt_id}%"),
                ).fetchone()[0]
                == 1
            )

    wait_for(swept, 10, "the expired lease is recorded")


def test_sigterm_stops_every_worker_within_grace(cluster):
    server = cluster.server
    pids = worker_pids(server.process.pid)
    assert sorted(pids) == [0, 1]
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=STOP_WITHIN_SECONDS + 5) == 0
    assert time.monotonic() - signalled < STOP_WITHIN_SECONDS
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived its supervisor"
    log = server.full_log()
    for index, pid in pids.items():
        assert f"[worker {index} pid {pid}] effect_ledger.transport.workers shutting down (grace 1.0 s)" in log
    assert "every worker stopped" in log and "still running after its grace" not in log


# --- servers of their own -----------------------------------------------------------------------


def test_without_the_flag_there_is_one_worker_per_cpu(database, capsys):
    expected = default_worker_count()
    assert expected == min(max(1, len(os.sched_getaffinity(0))), 64)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert f"0 (the default): one per CPU this process may use ({expected} here)" in " ".join(
        capsys.readouterr().out.split()
    )
    server = ServerProcess(database, workers=None).start()
    try:
        assert len(worker_pids(server.process.pid)) == (expected if expected > 1 else 0)
    finally:
        server.stop()


def test_a_worker_that_cannot_start_fails_the_supervisor(database, tmp_path):
    # A policy that does not parse: the supervisor starts the workers (a taken port it refuses
    # itself, before any worker starts), and each worker fails while loading it.
    policy_folder = tmp_path / "policy"
    shutil.copytree(default_policy_dir(), policy_folder)
    (policy_folder / "broken.rego").write_text("package effectledger.broken\n\nthis is not rego {\n")
    server = ServerProcess(database, workers=WORKERS, extra_args=["--policy-dir", str(policy_folder)])
    with pytest.raises(RuntimeError, match="server exited with 1"):
        server.start()
    log = server.full_log()
    assert "before serving; stopping the other workers" in log
    assert "serving on port" not in log and "every worker stopped" in log


def test_a_worker_that_keeps_dying_stops_the_server_with_status_1(database):
    server = ServerProcess(database, workers=WORKERS).start()
    try:
        survivor = worker_pids(server.process.pid)[1]
        killed = []
        while server.process.poll() is None and len(killed) <= RESTARTS_MAX:
            pid = wait_for(
                lambda: worker_pids(server.process.pid).get(0) or server.process.poll() is not None,
                REPLACEMENT_WITHIN_SECONDS,
                "a worker 0 to kill",
            )
            if pid is True:
                break
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            wait_for(lambda: process_state(pid) in ("Z", "gone"), 10, "the killed worker has exited")  # noqa: B023
        assert server.process.wait(timeout=STOP_WITHIN_SECONDS + 5) == 1
        assert len(killed) == RESTARTS_MAX + 1
        log = server.full_log()
        assert f"after {RESTARTS_MAX} restarts within 60 s: giving up" in log
        assert f"[worker 1 pid {survivor}] effect_ledger.transport.workers shutting down" in log
        assert "every worker stopped" in log and process_state(survivor) == "gone"
    finally:
        server.kill()


def test_restarts_back_off_and_are_bounded():
    supervisor = Supervisor(lambda index, fd: [], WORKERS, "127.0.0.1:0", "", GRACE_SECONDS)
    delays = [supervisor._restart_delay(0) for _ in range(RESTARTS_MAX + 1)]
    assert delays[:RESTARTS_MAX] == [0.1 * 2**n for n in range(RESTARTS_MAX)]
    assert delays[RESTARTS_MAX] is None
    assert supervisor._restart_delay(1) == 0.1  # each worker has its own budget
