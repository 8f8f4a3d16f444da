"""PostgreSQL itself goes down hard and comes back: nothing acknowledged is lost.

A private PostgreSQL cluster (initdb into a temporary folder, its own port and socket folder)
serves one ``effect-ledger serve`` process. Worker threads run authorize -> outcome cycles
against a budget and record every write the service acknowledged. Mid-run the cluster is
stopped with ``pg_ctl stop -m immediate`` (no checkpoint, no goodbye to clients: what a crash
looks like to the server). While it is down the health service reads NOT_SERVING and calls fail
UNAVAILABLE, never ALLOW. The cluster starts again (crash recovery), and the same server
process turns SERVING by itself. Then every acknowledged ALLOW and outcome is in the ledger,
each budget's counters equal the sums over its reservations with posted + pending <= limit, and
``effect-ledger verify`` walks every hash chain.

The same cluster also shows that the server refuses to start when synchronous_commit is off
(it could acknowledge a decision that a crash then loses).
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2

from effect_ledger import errors
from effect_ledger.storage.dialect import normalize_url
from effectledger.v1 import budgets_pb2, common_pb2, gate_pb2, runs_pb2
from support import ServerProcess, Tenant, contract, migrate, new_tenant, psycopg_url

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_DEADLINE_SECONDS = 15.0
WORKERS = 6
WORKLOAD_BEFORE_STOP_SECONDS = 3.0
DOWNTIME_SECONDS = 3.0
WORKLOAD_AFTER_RECOVERY_SECONDS = 2.0
WORKLOAD_SECONDS_MAX = 90.0  # every loop ends by itself by then, whatever happens
CALL_TIMEOUT_SECONDS = 8.0
TOOL = "payment.charge"
ESTIMATE = 7
USAGE = 5
TENANT_LIMIT = 5000
# Two workers share a run whose own budget fills up: reservations race at its limit.
TIGHT_WORKERS = 2
TIGHT_RUN_LIMIT = 100


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    for _ in range(50):
        port = 55432 + random.randrange(2000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for the private PostgreSQL")


class PrivateCluster:
    """A PostgreSQL cluster of this test's own, in a temporary folder, owned by user postgres."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="el-pgcluster-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.logfile = self.root / "postgres.log"
        self.port = free_port()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.sockets.mkdir()
        if self.as_postgres:
            for path in (self.root, self.sockets):
                shutil.chown(path, "postgres", "postgres")

    def _run(self, *command: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self.as_postgres, *command], capture_output=True, text=True, timeout=timeout, cwd=self.root, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{command[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{self.log()}"
            )

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "root", "--no-sync")

    def start(self) -> None:
        options = f"-k {self.sockets} -p {self.port} -c listen_addresses=127.0.0.1"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop_immediately(self) -> None:
        """SIGQUIT to the postmaster: no checkpoint; the next start runs crash recovery."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://root@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return normalize_url(self.url(name))

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def destroy(self) -> None:
        try:
            if self.running():
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries are not installed")
    private = PrivateCluster(bin_dir)
    try:
        private.init()
        private.start()
        yield private
    finally:
        private.destroy()
    assert not private.root.exists()


# --- the workload ------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the service acknowledged, and every error it answered."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    allowed: dict[str, tuple[str, str]] = field(default_factory=dict)  # attempt -> (effect, key)
    outcomes: dict[str, str] = field(default_factory=dict)  # attempt -> stage acknowledged
    errors: list[tuple[float, str, str, str]] = field(default_factory=list)  # (when, call, code, reason)
    answers: list[tuple[float, str, str]] = field(default_factory=list)  # (when, call, outcome)
    failures: list[str] = field(default_factory=list)  # a worker's unexpected exception

    def error(self, call: str, error: errors.LedgerError) -> None:
        with self.lock:
            self.errors.append((time.monotonic(), call, error.grpc_code.name, error.reason))  # type: ignore[attr-defined]


def worker(
    number: int, tenant: Tenant, server: ServerProcess, run_id: str, ledger: Ledger, stop: threading.Event
) -> None:
    agent = tenant.client(server, "agent", timeout_seconds=CALL_TIMEOUT_SECONDS)
    ends = time.monotonic() + WORKLOAD_SECONDS_MAX
    unreported: list[tuple[str, gate_pb2.RecordOutcomeRequest, str]] = []
    cycle = 0
    try:
        while not stop.is_set() and time.monotonic() < ends:
            # An outcome the service did not acknowledge is reported again, as a runtime would.
            if unreported:
                attempt_id, request, stage = unreported[0]
                try:
                    response = agent.gate.RecordOutcome(request)
                except errors.LedgerError as error:
                    ledger.error("RecordOutcome", error)
                    time.sleep(0.05)
                    continue
                if common_pb2.Stage.Name(response.attempt.stage) != stage:
                    raise AssertionError(f"{attempt_id}: reported {stage}, the service says {response}")
                with ledger.lock:
                    ledger.outcomes[attempt_id] = stage
                unreported.pop(0)
                continue
            cycle += 1
            key = f"w{number}-{cycle}"
            request = gate_pb2.AuthorizeEffectRequest(
                run_id=run_id,
                tool=TOOL,
                arguments_json=b'{"amount":%d}' % cycle,
                idempotency_key=key,
                target=f"card:{number}",
                estimate={"usd_micros": ESTIMATE},
            )
            try:
                response = agent.gate.AuthorizeEffect(request)
            except errors.LedgerError as error:
                ledger.error("AuthorizeEffect", error)
                time.sleep(0.05)
                continue
            outcome = common_pb2.Outcome.Name(response.outcome)
            with ledger.lock:
                ledger.answers.append((time.monotonic(), "AuthorizeEffect", outcome))
                if outcome == "ALLOW":
                    ledger.allowed[response.attempt_id] = (response.effect_id, key)
            if outcome != "ALLOW":
                continue
            if cycle % 3 == 0:
                continue  # left open: its reservation stays pending
            if cycle % 3 == 1:
                report = gate_pb2.RecordOutcomeRequest(
                    attempt_id=response.attempt_id,
                    succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
                        receipt=common_pb2.Receipt(provider_reference=f"ch-{key}"), usage={"usd_micros": USAGE}
                    ),
                )
                unreported.append((response.attempt_id, report, "SUCCEEDED"))
            else:
                report = gate_pb2.RecordOutcomeRequest(
                    attempt_id=response.attempt_id,
                    failed=gate_pb2.RecordOutcomeRequest.Failed(
                        reason="card declined", evidence=gate_pb2.PROVIDER_REJECTED
                    ),
                )
                unreported.append((response.attempt_id, report, "FAILED"))
    except Exception as error:
        with ledger.lock:
            ledger.failures.append(f"worker {number}: {error!r}")
    finally:
        agent.close()


def health_or_none(server: ServerProcess):
    try:
        return server.health(timeout=1.0)
    except grpc.RpcError:
        return None


def wait_health(server: ServerProcess, wanted: int, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if health_or_none(server) == wanted:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"health did not turn {wanted} within {timeout} s:\n{server.log()}")


def budget_rows(url: str, tenant: str) -> list[tuple]:
    with psycopg.connect(psycopg_url(url)) as connection:
        return connection.execute(
            """
            SELECT b.budget_id, b.limit_amount, b.posted, b.pending,
                   coalesce(sum(r.posted_amount) FILTER (WHERE r.state = 'POSTED'), 0),
                   coalesce(sum(r.amount) FILTER (WHERE r.state = 'PENDING'), 0),
                   count(r.reservation_id)
            FROM budgets b LEFT JOIN reservations r
              ON r.tenant_id = b.tenant_id AND r.budget_id = b.budget_id
            WHERE b.tenant_id = %s
            GROUP BY b.budget_id, b.limit_amount, b.posted, b.pending
            """,
            (tenant,),
        ).fetchall()


def test_the_ledger_survives_postgres_stopping_immediately(cluster):
    url = cluster.create_database(f"el_restart_{uuid.uuid4().hex[:8]}")
    migrate(url)
    tenant = new_tenant(url)
    server = ServerProcess(url).start()
    ledger = Ledger()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
        admin.tools.PutToolContract(contract(TOOL, lease_seconds=3600))
        admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="usd_micros", limit=TENANT_LIMIT)
        )
        run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        tight_run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(
                scope=budgets_pb2.RUN, scope_id=tight_run_id, dimension="usd_micros", limit=TIGHT_RUN_LIMIT
            )
        )
        assert server.health() == SERVING
        pid = server.process.pid

        threads = [
            threading.Thread(
                target=worker,
                args=(n, tenant, server, tight_run_id if n < TIGHT_WORKERS else run_id, ledger, stop),
                daemon=True,
            )
            for n in range(WORKERS)
        ]
        for thread in threads:
            thread.start()
        time.sleep(WORKLOAD_BEFORE_STOP_SECONDS)
        with ledger.lock:
            allowed_before_stop = dict(ledger.allowed)
        assert allowed_before_stop, "the workload made no progress before the stop"

        cluster.stop_immediately()
        stopped_at = time.monotonic()
        not_serving_after = wait_health(server, NOT_SERVING, HEALTH_DEADLINE_SECONDS)
        # While the database is down, a call is refused UNAVAILABLE, never answered.
        probe = tenant.client(server, "agent", timeout_seconds=CALL_TIMEOUT_SECONDS)
        with pytest.raises(errors.StorageUnavailable):
            probe.gate.AuthorizeEffect(
                gate_pb2.AuthorizeEffectRequest(
                    run_id=run_id,
                    tool=TOOL,
                    arguments_json=b"{}",
                    idempotency_key="probe-down",
                    target="card:x",
                    estimate={"usd_micros": ESTIMATE},
                )
            )
        time.sleep(max(0.0, DOWNTIME_SECONDS - (time.monotonic() - stopped_at)))
        down_until = time.monotonic()
        assert health_or_none(server) == NOT_SERVING

        cluster.start()
        serving_after = wait_health(server, SERVING, HEALTH_DEADLINE_SECONDS)
        recovered_at = time.monotonic()
        assert server.process.poll() is None and server.process.pid == pid  # recovered by itself
        after = probe.gate.AuthorizeEffect(
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id,
                tool=TOOL,
                arguments_json=b"{}",
                idempotency_key="probe-up",
                target="card:x",
                estimate={"usd_micros": ESTIMATE},
            )
        )
        assert common_pb2.Outcome.Name(after.outcome) == "ALLOW"
        with ledger.lock:
            ledger.allowed[after.attempt_id] = (after.effect_id, "probe-up")
        probe.close()
        time.sleep(WORKLOAD_AFTER_RECOVERY_SECONDS)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=CALL_TIMEOUT_SECONDS * 3)
    try:
        assert not any(thread.is_alive() for thread in threads)
        assert ledger.failures == []
        # Every error was UNAVAILABLE, and none came from outside the outage (plus the time the
        # server took to notice the database was back); while it was down nothing was answered.
        codes = {(call, code, reason) for _, call, code, reason in ledger.errors}
        assert {code for _, code, _ in codes} <= {"UNAVAILABLE"}, codes
        # The database was unreachable (nothing written), or it broke while a COMMIT was in
        # flight (the write may have landed: a retry under the same key answers from the ledger).
        assert {reason for _, _, reason in codes} <= {"STORAGE_UNAVAILABLE", "COMMIT_OUTCOME_UNKNOWN"}, codes
        assert ledger.errors, "the workload never hit the outage"
        assert all(stopped_at - 1.0 <= when for when, *_ in ledger.errors), "errors before the outage"
        late = [e for e in ledger.errors if e[0] > recovered_at + 1.0]
        assert late == [], f"calls still failing after the server reported SERVING again: {late[:5]}"
        answered_while_down = [a for a in ledger.answers if stopped_at + 1.0 < a[0] < down_until]
        assert answered_while_down == []
        allowed_after = [a for a in ledger.answers if a[0] > down_until and a[2] == "ALLOW"]
        assert allowed_after, "no ALLOW after the database came back"

        agent = tenant.client(server, "agent")
        # Every acknowledged ALLOW is in the ledger, with its attempt; every acknowledged outcome too.
        for attempt_id, (effect_id, key) in ledger.allowed.items():
            effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
            assert effect.idempotency_key == key
            stages = {a.attempt_id: common_pb2.Stage.Name(a.stage) for a in effect.attempts}
            assert attempt_id in stages, (key, stages)
            if attempt_id in ledger.outcomes:
                assert stages[attempt_id] == ledger.outcomes[attempt_id], (key, stages, ledger.outcomes[attempt_id])
        assert set(ledger.outcomes) <= set(ledger.allowed)
        # The budget: counters equal the sums over reservations, and never past the limit.
        rows = {row[1]: row for row in budget_rows(url, tenant.name)}
        assert sorted(rows) == [TIGHT_RUN_LIMIT, TENANT_LIMIT], rows
        for _, limit, posted, pending, posted_sum, pending_sum, _ in rows.values():
            assert (posted, pending) == (posted_sum, pending_sum), rows
            assert posted + pending <= limit, rows
        tenant_reservations = rows[TENANT_LIMIT][6]
        assert tenant_reservations >= len(ledger.allowed)
        shown = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.TENANT)).budgets[0]
        assert (shown.posted, shown.pending) == rows[TENANT_LIMIT][2:4]
        tight = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=tight_run_id))
        assert (tight.budgets[0].posted, tight.budgets[0].pending) == rows[TIGHT_RUN_LIMIT][2:4]
        denied = sum(outcome == "DENY" for _, _, outcome in ledger.answers)
        assert denied > 0, "the tight run's budget never filled up"
        verified = subprocess.run(
            [sys.executable, "-m", "effect_ledger", "verify", "--database-url", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        agent.close()
        print(
            f"\nacknowledged: {len(ledger.allowed)} ALLOW ({len(allowed_before_stop)} before the stop), "
            f"{len(ledger.outcomes)} outcomes; {len(ledger.errors)} UNAVAILABLE answers "
            f"{dict(Counter(reason for *_, reason in ledger.errors))}; "
            f"NOT_SERVING {not_serving_after:.2f} s after the stop, SERVING {serving_after:.2f} s after the start; "
            f"{denied} DENY (budget); budgets (limit, posted, pending, reservations): "
            f"{[(r[1], r[2], r[3], r[6]) for r in rows.values()]}"
        )
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["connection options", "database setting"])
def test_the_server_refuses_to_start_when_synchronous_commit_is_off(cluster, how):
    name = f"el_async_{uuid.uuid4().hex[:8]}"
    url = cluster.create_database(name)
    if how == "connection options":
        url += "?options=-c%20synchronous_commit%3Doff"
    else:
        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            connection.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    server = ServerProcess(url)
    with pytest.raises(RuntimeError) as refused:
        server.start()
    try:
        assert server.process.returncode not in (0, None)
        assert "synchronous_commit" in str(refused.value), str(refused.value)
        assert "refusing to start" in str(refused.value)
    finally:
        server.kill()
