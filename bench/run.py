"""Benchmark: the gate's RPCs against a server on PostgreSQL, each beside a trivial RPC.

    .venv/bin/python bench/run.py                        # 1 and 2 workers, 32 callers, 10 s windows
    .venv/bin/python bench/run.py --seconds 3 --workers 1 --layouts runs     # a quick check
    .venv/bin/python bench/run.py --levels 8,32 --scenarios authorize,cycle
    .venv/bin/python bench/run.py --soak-minutes 30      # server memory over 30 minutes of cycles

For each server process count (``--workers``) and each run layout (``--layouts``) it creates a
fresh PostgreSQL database, starts ``effect-ledger serve`` on it with
``EFFECT_LEDGER_ROUND_TRIPS_FILE`` set, prepares (principals, a tool contract, a budget, the
runs, effects already settled) and starts the client processes (``--client-processes``, 2 by
default, each with its share of the callers and ``--channels`` connections of its own). Then,
for each concurrency level and each scenario: a warm-up window that is not measured, a
``health`` window and the scenario's window, both measured on the same server. Scenarios:

- ``health``: ``grpc.health.v1.Health/Check``, the baseline of what the server and this machine
  do for a trivial RPC with the same clients; each scenario's ratio is to the health window
  measured just before it;
- ``authorize``: AuthorizeEffect with a new key and an estimate of 250 usd_micros against a
  budget that never runs out; an operation is an ALLOW answer (the lease, 3600 s, outlasts the
  run);
- ``cycle``: AuthorizeEffect + RecordDispatch + RecordOutcome (succeeded, with a receipt and
  usage); an operation is a whole cycle;
- ``cycle2``: AuthorizeEffect with ``begin_dispatched`` + RecordOutcome;
- ``duplicate``: AuthorizeEffect on keys already succeeded (answers DUPLICATE);
- ``deny``: AuthorizeEffect for a tool that is not registered (answers DENY).

Run layouts: ``runs`` (the main rows), each caller drives a run of its own, created in setup,
the way concurrent agent runs do; ``one``, all callers share one run.

What each row reports, over the measured window only:

- ops/s and the ratio to health; p50/p95/p99 latency of every RPC, as the client timed it;
- server CPU milliseconds per operation: user + system CPU time of the server process and all
  its descendants (a supervisor and its workers), read from ``/proc/<pid>/stat`` at the start
  and the end of the window, divided by the operations;
- database round trips per RPC, counted in the server, not estimated: every server process
  counts per gRPC method (``effect_ledger/storage/round_trips.py``) and writes its counts when
  sent SIGUSR1; the benchmark takes such a snapshot before and after each window and divides
  the difference by the calls. Setup and warm-up calls fall outside every window;
- errors per RPC (a status other than OK, or an unexpected answer), and whether the row meets
  its targets: authorize >= 0.25 x health with a p99 <= 30 ms and <= 0.6 ms of server CPU per
  AuthorizeEffect; cycle >= 0.10 x; cycle2 >= 0.15 x; duplicate >= 0.40 x; deny >= 0.30 x.
  A row with errors does not meet its targets.

Results go to ``bench/results/latest.md`` (the table, the command, the date, the machine) and
``bench/results/latest.json`` (also each row's health window, the round trips of every method
in the window, those made outside any RPC under ``(no RPC)``: the health monitor's ping, the
lease sweeper; and per server the totals its processes wrote at shutdown, setup included).
Clients, server and PostgreSQL share the machine: the ratios include that.

Soak (``--soak-minutes M`` and/or ``--soak N``): one server (the first ``--workers`` value,
round-trip counting off), effect cycles at ``--soak-concurrency`` callers on as many runs,
until M minutes have passed or N cycles completed, whichever comes first; the server's RSS
(summed over its processes) is sampled every ``--soak-sample-seconds``. It reports the RSS
after the warm-up (``--soak-warmup-minutes``) and at the end, and the growth in percent (the
target: within 5 %), in ``bench/results/soak.json`` and ``bench/results/soak.md``.

Options:

--pg-url URL              admin connection that creates and drops the databases
                          (default ``$EFFECT_LEDGER_BENCH_PG_URL`` or
                          ``postgresql://root@127.0.0.1:5432/postgres``)
--workers 1,2             server process counts, passed as ``serve --workers N`` (1 included:
                          its default is one per CPU); N > 1 is skipped, with a message, when
                          ``serve`` has no such flag
--levels 32               total concurrent callers, split evenly over the client processes
--layouts runs,one        ``runs``: one run per caller; ``one``: one run for all callers
--scenarios LIST          among authorize,cycle,cycle2,duplicate,deny (default: all);
                          health is always measured beside each
--seconds 10              length of each measured window
--warmup-seconds 2        unmeasured window of the scenario before its measured pair
--client-processes 2      client processes (grpc.aio, one event loop each)
--channels 4              gRPC connections per client process (each on its own subchannel,
                          so the kernel spreads them over the workers)
--pool-size 10            ``--database-pool-size`` of each server process
--settled-keys 64         effects settled in setup per layout, for ``duplicate`` (at least 2 a run)
--out PREFIX              output files without extension (default bench/results/latest, or
                          bench/results/soak for a soak)
--soak-minutes M          soak for M minutes
--soak N                  soak until N effect cycles (with --soak-minutes: whichever first)
--soak-concurrency 32     callers (and runs) of the soak
--soak-warmup-minutes 2   the RSS reference is the first sample after this
--soak-sample-seconds 10  RSS sampling interval
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from effectledger.v1 import (
    budgets_pb2,
    budgets_pb2_grpc,
    common_pb2,
    gate_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SCENARIOS = ("authorize", "cycle", "cycle2", "duplicate", "deny")
LAYOUTS = ("runs", "one")
ROUND_TRIPS_FILE = "round_trips.json"
LEASE_SECONDS = 3600
ESTIMATE = {"usd_micros": 250}
USAGE = {"usd_micros": 200}
TARGETS = {
    "authorize": {"ratio_min": 0.25, "p99_ms_max": 30.0, "cpu_ms_per_op_max": 0.6},
    "cycle": {"ratio_min": 0.10},
    "cycle2": {"ratio_min": 0.15},
    "duplicate": {"ratio_min": 0.40},
    "deny": {"ratio_min": 0.30},
}
RPC_TIMEOUT_SECONDS = 10.0
SNAPSHOT_TIMEOUT_SECONDS = 15.0
SERVER_START_TIMEOUT_SECONDS = 60.0


# --- the server under test: processes, CPU, memory, round-trip counts -----------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # [0] is the state (field 3 of proc(5))


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, found by walking /proc/*/stat for their parents."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (utime and stime, fields 14 and 15)."""
    ticks = 0
    for pid in pids:
        if (fields := _stat_fields(pid)) is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def memory_kib(pids: list[int], field_name: str = "VmRSS") -> int:
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in lines if line.startswith(field_name + ":"))
    return total


def serve_has_workers_flag() -> bool:
    helped = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return "--workers" in helped.stdout


@dataclass
class Server:
    database_url: str
    pool_size: int
    workers: int = 1
    # Whether ``serve`` has --workers (its default is then one worker per CPU, so say 1 too).
    workers_flag: bool = True
    count_round_trips: bool = True
    process: subprocess.Popen | None = None
    port: int = 0
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="el-bench-")))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        port_file = self.folder / "port"
        arguments = [sys.executable, "-m", "effect_ledger", "--log-level", "WARNING", "serve"]
        arguments += ["--database-url", self.database_url, "--listen", "127.0.0.1:0"]
        arguments += ["--port-file", str(port_file), "--database-pool-size", str(self.pool_size)]
        # All callers share one agent token here: the per-token rate limit (a guard against one
        # runaway agent) would measure itself, so it is off.
        arguments += ["--maximum-concurrent-rpcs", "1000", "--requests-per-second-per-token", "0"]
        if self.workers_flag or self.workers > 1:
            arguments += ["--workers", str(self.workers)]
        environment = dict(os.environ)
        environment.pop("EFFECT_LEDGER_ROUND_TRIPS_FILE", None)
        if self.count_round_trips:
            environment["EFFECT_LEDGER_ROUND_TRIPS_FILE"] = str(self.folder / ROUND_TRIPS_FILE)
        self.process = subprocess.Popen(
            arguments,
            env=environment,
            cwd=self.folder,
            stdout=(self.folder / "server.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
        while not (port_file.exists() and port_file.read_text().strip()):
            self._check_alive(deadline)
        self.port = int(port_file.read_text())
        while self.count_round_trips and len(self.counting_pids()) < self.workers:
            self._check_alive(deadline)
        self._wait_serving(deadline)

    def _check_alive(self, deadline: float) -> None:
        if self.process.poll() is not None:
            raise SystemExit("the server exited:\n" + (self.folder / "server.log").read_text()[-4000:])
        if time.monotonic() > deadline:
            raise SystemExit(f"the server did not start within {SERVER_START_TIMEOUT_SECONDS} s")
        time.sleep(0.05)

    def _wait_serving(self, deadline: float) -> None:
        with grpc.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    if (
                        health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                        == health_pb2.HealthCheckResponse.SERVING
                    ):
                        return
                except grpc.RpcError:
                    pass
                self._check_alive(deadline)

    def pids(self) -> list[int]:
        return process_tree(self.process.pid)

    def counting_pids(self) -> list[int]:
        """The server's processes that count round trips (each wrote its file on starting)."""
        return [pid for pid in self.pids() if (self.folder / f"{ROUND_TRIPS_FILE}.{pid}").exists()]

    def snapshot(self) -> tuple[list[int], dict[str, dict[str, int]]]:
        """Every counting process writes its counts now (SIGUSR1): their pids, the counts summed."""
        pids = self.counting_pids()
        for pid in pids:
            (self.folder / f"{ROUND_TRIPS_FILE}.{pid}").unlink()
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_SECONDS
        while not all((self.folder / f"{ROUND_TRIPS_FILE}.{pid}").exists() for pid in pids):
            if time.monotonic() > deadline:
                raise SystemExit(f"server processes {pids} did not write their round-trip counts")
            time.sleep(0.01)
        return pids, self.read_counts(pids)

    def read_counts(self, pids: list[int] | None = None) -> dict[str, dict[str, int]]:
        """Counts per method, summed over ``pids`` (over every file written when None)."""
        files = (
            [self.folder / f"{ROUND_TRIPS_FILE}.{pid}" for pid in pids]
            if pids is not None
            else sorted(self.folder.glob(f"{ROUND_TRIPS_FILE}.*[0-9]"))
        )
        total: dict[str, dict[str, int]] = {}
        for path in files:
            for method, counts in json.loads(path.read_text()).items():
                entry = total.setdefault(method, {"calls": 0, "round_trips": 0})
                entry["calls"] += counts["calls"]
                entry["round_trips"] += counts["round_trips"]
        return total

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def count_difference(before: dict, after: dict) -> dict[str, dict]:
    result = {}
    for method in sorted(after):
        calls = after[method]["calls"] - before.get(method, {}).get("calls", 0)
        trips = after[method]["round_trips"] - before.get(method, {}).get("round_trips", 0)
        if calls or trips:
            result[method] = {
                "calls": calls,
                "round_trips": trips,
                "per_call": round(trips / calls, 2) if calls else None,
            }
    return result


# --- the database and what the clients need from it -----------------------------------------


def create_database(admin_url: str) -> str:
    import psycopg

    name = f"el_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_database(admin_url: str, url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def settled_arguments(index: int) -> tuple[bytes, str]:
    return b'{"n":%d}' % index, f"mailto:settled-{index}@example.com"


def prepare(url: str, target: str, runs: int, settled_keys: int) -> dict:
    """Principals, a contract, a budget that never runs out, the runs, effects already settled."""
    from effect_ledger.cli import add_principal

    tenant = f"bench-{uuid.uuid4().hex[:6]}"
    admin = (("authorization", f"Bearer {add_principal(url, tenant, 'admin', ['admin'])}"),)
    token = add_principal(url, tenant, "agent", ["agent"])
    agent = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(target) as channel:
        tools_pb2_grpc.ToolRegistryStub(channel).PutToolContract(
            tools_pb2.PutToolContractRequest(
                contract=tools_pb2.ToolContract(
                    tool="email.send",
                    effect_class=common_pb2.RETRYABLE_WITH_KEY,
                    provider_idempotency=True,
                    max_attempts=3,
                    lease_seconds=LEASE_SECONDS,
                )
            ),
            metadata=admin,
            timeout=10,
        )
        budgets_pb2_grpc.BudgetsStub(channel).PutBudget(
            budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="usd_micros", limit=2**62),
            metadata=admin,
            timeout=10,
        )
        runs_stub = runs_pb2_grpc.RunsStub(channel)
        run_ids = [
            runs_stub.CreateRun(runs_pb2.CreateRunRequest(), metadata=agent, timeout=10).run_id for _ in range(runs)
        ]
        gate = gate_pb2_grpc.GateStub(channel)
        settled: dict[str, list[tuple[str, int]]] = {run_id: [] for run_id in run_ids}
        for index in range(max(settled_keys, 2 * runs)):
            run_id, key = run_ids[index % runs], f"settled-{index}"
            arguments, effect_target = settled_arguments(index)
            allowed = gate.AuthorizeEffect(
                gate_pb2.AuthorizeEffectRequest(
                    run_id=run_id,
                    tool="email.send",
                    arguments_json=arguments,
                    idempotency_key=key,
                    target=effect_target,
                ),
                metadata=agent,
                timeout=10,
            )
            gate.RecordOutcome(
                gate_pb2.RecordOutcomeRequest(
                    attempt_id=allowed.attempt_id,
                    succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
                        receipt=common_pb2.Receipt(provider_reference=f"ref-{index}")
                    ),
                ),
                metadata=agent,
                timeout=10,
            )
            settled[run_id].append((key, index))
    return {"token": token, "runs": run_ids, "settled": settled}


# --- clients: long-lived processes, each running windows on command -------------------------


class Recorder:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.completed = 0

    def error(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    async def timed(self, name: str, call, expected: int | None = None):
        """The response, or None after counting an error (a status, or an unexpected answer)."""
        start = time.perf_counter()
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            self.error(f"{name}: {error.code().name}")
            return None
        self.latencies.setdefault(name, []).append(time.perf_counter() - start)
        if expected is not None and response.outcome != expected:
            self.error(f"{name}: answered {common_pb2.Outcome.Name(response.outcome)}")
            return None
        return response


@dataclass
class Caller:
    """One concurrent caller: its stubs, its run, the keys it may repeat, a unique key prefix."""

    health: health_pb2_grpc.HealthStub
    gate: gate_pb2_grpc.GateStub
    metadata: tuple
    run_id: str
    settled: list[tuple[str, int]]
    prefix: str
    recorder: Recorder
    sequence: int = 0

    def next_key(self) -> str:
        self.sequence += 1
        return f"{self.prefix}-{self.sequence}"

    async def authorize(self, request, expected: int):
        call = self.gate.AuthorizeEffect(request, metadata=self.metadata, timeout=RPC_TIMEOUT_SECONDS)
        return await self.recorder.timed("AuthorizeEffect", call, expected)

    async def authorize_new(self, key: str, begin_dispatched: bool = False):
        """AuthorizeEffect with a new key and an estimate: the ALLOW answer, or None."""
        request = gate_pb2.AuthorizeEffectRequest(
            run_id=self.run_id,
            tool="email.send",
            arguments_json=b'{"subject":"bench"}',
            idempotency_key=key,
            target=f"mailto:{key}@example.com",
            estimate=ESTIMATE,
            begin_dispatched=begin_dispatched,
        )
        return await self.authorize(request, common_pb2.ALLOW)

    async def dispatch(self, attempt_id: str):
        request = gate_pb2.RecordDispatchRequest(attempt_id=attempt_id)
        call = self.gate.RecordDispatch(request, metadata=self.metadata, timeout=RPC_TIMEOUT_SECONDS)
        return await self.recorder.timed("RecordDispatch", call)

    async def succeed(self, attempt_id: str, key: str):
        receipt = common_pb2.Receipt(provider_reference=key, detail_json=b'{"ok":true}')
        request = gate_pb2.RecordOutcomeRequest(
            attempt_id=attempt_id,
            succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(receipt=receipt, usage=USAGE),
        )
        call = self.gate.RecordOutcome(request, metadata=self.metadata, timeout=RPC_TIMEOUT_SECONDS)
        return await self.recorder.timed("RecordOutcome", call)


# One operation of each scenario: True when it completed as the scenario expects.


async def health_operation(caller: Caller) -> bool:
    call = caller.health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_SECONDS)
    return await caller.recorder.timed("Check", call) is not None


async def authorize_operation(caller: Caller) -> bool:
    return await caller.authorize_new(caller.next_key()) is not None


async def cycle_operation(caller: Caller) -> bool:
    key = caller.next_key()
    allowed = await caller.authorize_new(key)
    if allowed is None or await caller.dispatch(allowed.attempt_id) is None:
        return False
    return await caller.succeed(allowed.attempt_id, key) is not None


async def cycle2_operation(caller: Caller) -> bool:
    key = caller.next_key()
    allowed = await caller.authorize_new(key, begin_dispatched=True)
    return allowed is not None and await caller.succeed(allowed.attempt_id, key) is not None


async def duplicate_operation(caller: Caller) -> bool:
    key, index = caller.settled[caller.sequence % len(caller.settled)]
    caller.sequence += 1
    arguments, target = settled_arguments(index)
    request = gate_pb2.AuthorizeEffectRequest(
        run_id=caller.run_id,
        tool="email.send",
        arguments_json=arguments,
        idempotency_key=key,
        target=target,
    )
    return await caller.authorize(request, common_pb2.DUPLICATE) is not None


async def deny_operation(caller: Caller) -> bool:
    request = gate_pb2.AuthorizeEffectRequest(
        run_id=caller.run_id,
        tool="not.registered",
        arguments_json=b"{}",
        idempotency_key=caller.next_key(),
        target="x",
    )
    return await caller.authorize(request, common_pb2.DENY) is not None


OPERATIONS = {
    "health": health_operation,
    "authorize": authorize_operation,
    "cycle": cycle_operation,
    "cycle2": cycle2_operation,
    "duplicate": duplicate_operation,
    "deny": deny_operation,
}


async def run_window(channels: list, setup: dict, command: dict) -> dict:
    """This process's share of one window: its callers from ``start_at`` for ``seconds``."""
    metadata = (("authorization", f"Bearer {setup['token']}"),)
    runs = setup["runs"][: command["runs"]]
    nonce = uuid.uuid4().hex[:8]
    recorder = Recorder()
    callers = []
    for lane in range(command["lanes"]):
        index = command["caller_offset"] + lane
        channel = channels[lane % len(channels)]
        run_id = runs[index % len(runs)]
        stubs = health_pb2_grpc.HealthStub(channel), gate_pb2_grpc.GateStub(channel)
        prefix = f"{command['scenario']}-{nonce}-{index}"
        callers.append(Caller(*stubs, metadata, run_id, setup["settled"][run_id], prefix, recorder, index))
    operation = OPERATIONS[command["scenario"]]
    await asyncio.sleep(max(0.0, command["start_at"] - time.time()))
    deadline = command["start_at"] + command["seconds"]

    async def drive(caller: Caller) -> None:
        while time.time() < deadline:
            if await operation(caller):
                recorder.completed += 1

    await asyncio.gather(*(drive(caller) for caller in callers))
    return {
        "latencies": recorder.latencies,
        "errors": recorder.errors,
        "completed": recorder.completed,
        "ended_at": time.time(),
    }


async def _serve_commands(connection, target: str, setup: dict, channel_count: int) -> None:
    # A subchannel pool of its own per channel: separate TCP connections, spread over workers.
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(channel_count)
    ]
    await asyncio.gather(*(asyncio.wait_for(channel.channel_ready(), 10) for channel in channels))
    connection.send("ready")
    loop = asyncio.get_running_loop()
    while (command := await loop.run_in_executor(None, connection.recv)) is not None:
        connection.send(await run_window(channels, setup, command))
    for channel in channels:
        await channel.close()


def _client_process(connection, target: str, setup: dict, channel_count: int) -> None:
    asyncio.run(_serve_commands(connection, target, setup, channel_count))


class Clients:
    """``processes`` client processes against one server; ``window`` runs all of them at once."""

    def __init__(self, target: str, setup: dict, processes: int, channels: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.connections = []
        self.processes = []
        for _ in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(target=_client_process, args=(theirs, target, setup, channels), daemon=True)
            process.start()
            self.connections.append(ours)
            self.processes.append(process)
        for connection in self.connections:
            if not connection.poll(60) or connection.recv() != "ready":
                raise SystemExit("a client process did not connect")

    def window(self, scenario: str, callers: int, runs: int, seconds: float, on_start=None) -> dict:
        """``scenario`` by ``callers`` callers for ``seconds``; ``on_start()`` runs at the start."""
        count = len(self.connections)
        lanes = [callers // count + (1 if index < callers % count else 0) for index in range(count)]
        start_at = time.time() + 0.3
        for index, connection in enumerate(self.connections):
            connection.send(
                {
                    "scenario": scenario,
                    "lanes": lanes[index],
                    "caller_offset": sum(lanes[:index]),
                    "runs": runs,
                    "seconds": seconds,
                    "start_at": start_at,
                }
            )
        time.sleep(max(0.0, start_at - time.time()))
        started = on_start() if on_start else None
        parts = [connection.recv() for connection in self.connections]
        latencies: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        for part in parts:
            for name, values in part["latencies"].items():
                latencies.setdefault(name, []).extend(values)
            for name, count_ in part["errors"].items():
                errors[name] = errors.get(name, 0) + count_
        return {
            "latencies": latencies,
            "errors": errors,
            "completed": sum(part["completed"] for part in parts),
            "wall_seconds": max(part["ended_at"] for part in parts) - start_at,
            "started": started,
        }

    def close(self) -> None:
        for connection in self.connections:
            connection.send(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()


# --- measuring one window -------------------------------------------------------------------


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def latency_summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 2),
        "p95_ms": round(percentile(ordered, 0.95) * 1000, 2),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 2),
    }


def measure(server: Server, clients: Clients, scenario: str, callers: int, runs: int, seconds: float) -> dict:
    """One measured window: client latencies, server CPU and round trips over that window only."""
    counting_before, before = server.snapshot()
    pids = server.pids()
    window = clients.window(scenario, callers, runs, seconds, on_start=lambda: cpu_seconds(pids))
    cpu = cpu_seconds(server.pids()) - window["started"]
    counting_after, after = server.snapshot()
    trips = count_difference(before, after)
    if counting_after != counting_before or set(server.pids()) != set(pids):
        # A worker restarted: its counts and CPU time before the restart are lost.
        window["errors"]["server: a process restarted during the window"] = 1
    completed, wall = window["completed"], window["wall_seconds"]
    rpcs = {}
    for name, values in sorted(window["latencies"].items()):
        counted = next((counts for method, counts in trips.items() if method.endswith("/" + name)), None)
        rpcs[name] = {
            **latency_summary(values),
            "round_trips_per_call": counted["per_call"] if counted else None,
        }
    return {
        "scenario": scenario,
        "seconds": round(wall, 2),
        "operations": completed,
        "ops_per_second": round(completed / wall, 1),
        "server_cpu_seconds": round(cpu, 3),
        "server_cpu_ms_per_op": round(cpu * 1000 / completed, 3) if completed else None,
        "rpcs": rpcs,
        "round_trips": trips,
        "errors": window["errors"],
    }


def judge(scenario: str, result: dict) -> dict:
    """The row's targets and which of them it misses (errors always miss)."""
    targets = TARGETS.get(scenario, {})
    missed = []
    if "ratio_min" in targets and not (result["ratio_to_health"] or 0) >= targets["ratio_min"]:
        missed.append(f"ratio {result['ratio_to_health']} < {targets['ratio_min']}")
    if "p99_ms_max" in targets:
        p99 = result["rpcs"].get("AuthorizeEffect", {}).get("p99_ms")
        if p99 is None or p99 > targets["p99_ms_max"]:
            missed.append(f"p99 {p99} ms > {targets['p99_ms_max']}")
    if "cpu_ms_per_op_max" in targets:
        cpu = result["server_cpu_ms_per_op"]
        if cpu is None or cpu > targets["cpu_ms_per_op_max"]:
            missed.append(f"CPU {cpu} ms/op > {targets['cpu_ms_per_op_max']}")
    if result["errors"]:
        missed.append(f"{sum(result['errors'].values())} errors")
    return {"targets": targets, "met": not missed, "missed": missed}


def print_row(row: dict) -> None:
    trips = {
        method.rsplit("/", 1)[-1]: counts["per_call"]
        for method, counts in row["round_trips"].items()
        if counts["calls"]
    }
    print(
        f"workers={row['workers']} callers={row['callers']} runs={row['runs']} {row['scenario']}: "
        f"{row['ops_per_second']} ops/s, x{row.get('ratio_to_health')} health, "
        f"CPU {row['server_cpu_ms_per_op']} ms/op, round trips/RPC {trips}"
        + (f", ERRORS {row['errors']}" if row["errors"] else ""),
        flush=True,
    )


# --- one server: all levels and scenarios of one (workers, layout) --------------------------


def run_group(options, workers: int, workers_flag: bool, layout: str) -> tuple[list[dict], dict]:
    """The rows of one server, and what its processes counted in all (written at shutdown)."""
    levels = [int(value) for value in options.levels.split(",")]
    scenarios = [value for value in options.scenarios.split(",") if value]
    runs = max(levels) if layout == "runs" else 1
    url = create_database(options.pg_url)
    server = Server(url, options.pool_size, workers, workers_flag)
    clients = None
    rows = []
    try:
        from effect_ledger.cli import _migrate

        _migrate(url)
        server.start()
        setup = prepare(url, server.target, runs, options.settled_keys)
        clients = Clients(server.target, setup, options.client_processes, options.channels)
        for callers in levels:
            runs_used = callers if layout == "runs" else 1
            for scenario in scenarios:
                if options.warmup_seconds > 0:
                    clients.window(scenario, callers, runs_used, options.warmup_seconds)
                health = measure(server, clients, "health", callers, runs_used, options.seconds)
                result = measure(server, clients, scenario, callers, runs_used, options.seconds)
                result["health_ops_per_second"] = health["ops_per_second"]
                result["ratio_to_health"] = (
                    round(result["ops_per_second"] / health["ops_per_second"], 3) if health["ops_per_second"] else None
                )
                row = {
                    "workers": workers,
                    "layout": layout,
                    "callers": callers,
                    "runs": runs_used,
                    **result,
                    **judge(scenario, result),
                    "health": health,
                }
                print_row(row)
                rows.append(row)
        peak = memory_kib(server.pids(), "VmHWM")
        for row in rows:
            row["server_peak_rss_kib"] = peak
    finally:
        if clients is not None:
            clients.close()
        server.stop()
        drop_database(options.pg_url, url)
    totals = {"workers": workers, "layout": layout, "round_trips": server.read_counts()}
    shutil.rmtree(server.folder, ignore_errors=True)  # kept, with server.log, after a failure
    return rows, totals


# --- reports --------------------------------------------------------------------------------


def machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def postgres_version(admin_url: str) -> str:
    import psycopg

    with psycopg.connect(admin_url) as connection:
        return connection.execute("SHOW server_version").fetchone()[0]


def target_text(targets: dict) -> str:
    parts = []
    if "ratio_min" in targets:
        parts.append(f">= {targets['ratio_min']}x")
    if "p99_ms_max" in targets:
        parts.append(f"p99 <= {targets['p99_ms_max']:g} ms")
    if "cpu_ms_per_op_max" in targets:
        parts.append(f"CPU <= {targets['cpu_ms_per_op_max']} ms/op")
    return ", ".join(parts)


def table_rows(row: dict, health_row: bool) -> list[list[str]]:
    """Markdown cells: the scenario's first line, then one line per further RPC."""
    result = row["health"] if health_row else row
    lines = []
    for index, (name, rpc) in enumerate(result["rpcs"].items() or [("-", {})]):
        first = index == 0
        scenario_cells = (
            [
                str(row["workers"]),
                str(row["callers"]),
                str(row["runs"]),
                "health" if health_row else row["scenario"],
                str(result["ops_per_second"]),
                "1.000" if health_row else f"{row['ratio_to_health']} (of {row['health_ops_per_second']})",
                str(result["server_cpu_ms_per_op"]),
            ]
            if first
            else [""] * 7
        )
        latency = f"{rpc.get('p50_ms')} / {rpc.get('p95_ms')} / {rpc.get('p99_ms')}" if rpc else ""
        trips = rpc.get("round_trips_per_call")
        errors = ", ".join(f"{key} x{value}" for key, value in result["errors"].items()) or "none"
        verdict = "" if health_row else ("met" if row["met"] else "NOT met: " + "; ".join(row["missed"]))
        tail = [errors, "" if health_row else target_text(row["targets"]), verdict] if first else ["", "", ""]
        lines.append([*scenario_cells, name, latency, "" if trips is None else f"{trips:g}", *tail])
    return lines


def markdown(report: dict) -> str:
    header = [
        "workers",
        "callers",
        "runs",
        "scenario",
        "ops/s",
        "ratio to health",
        "server CPU ms/op",
        "RPC",
        "p50 / p95 / p99 ms",
        "DB round trips / RPC",
        "errors",
        "target",
        "verdict",
    ]
    lines = [
        measured_line(report) + ".",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Each scenario: a {report['warmup_seconds']} s warm-up, then a {report['seconds']} s "
        f"health window and a {report['seconds']} s window of the scenario on the same server; "
        f"{report['client_processes']} client processes with {report['channels']} connections "
        f"each; server pool {report['pool_size']} per process. Runs = callers: each caller drives "
        "its own run (the main rows); runs = 1: all callers share one run. Each ratio is to the "
        "health window just before it (in brackets); the health rows show the first of them. "
        "Server CPU: user + system time of all server processes over the window, per operation. "
        "Round trips: counted in the server per gRPC method over the window, per call.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    previous_group = None
    for row in report["rows"]:
        group = (row["workers"], row["callers"], row["runs"])
        if group != previous_group:
            lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(row, health_row=True)]
            previous_group = group
        lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(row, health_row=False)]
    lines.append("")
    for note in report["skipped"]:
        lines.append(f"Skipped: {note}")
    peaks = sorted({(row["workers"], row["runs"], row["server_peak_rss_kib"]) for row in report["rows"]})
    for workers, runs, peak in peaks:
        lines.append(
            f"Server peak RSS (VmHWM, summed over processes), {workers} worker(s), "
            f"runs = {runs}: {peak / 1024:.1f} MiB."
        )
    return "\n".join(lines) + "\n"


def write_report(prefix: str, report: dict, text: str) -> None:
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    Path(prefix + ".json").write_text(json.dumps(report, indent=2) + "\n")
    Path(prefix + ".md").write_text(text)


# --- soak -----------------------------------------------------------------------------------


def soak(options, workers: int, workers_flag: bool) -> dict:
    """Effect cycles until the time or the cycle count is reached, sampling the server's RSS."""
    url = create_database(options.pg_url)
    server = Server(url, options.pool_size, workers, workers_flag, count_round_trips=False)
    clients = None
    samples = []
    limit_seconds = options.soak_minutes * 60 if options.soak_minutes else float("inf")
    limit_cycles = options.soak or float("inf")
    cycles = errors = 0
    try:
        from effect_ledger.cli import _migrate

        _migrate(url)
        server.start()
        setup = prepare(url, server.target, options.soak_concurrency, options.settled_keys)
        clients = Clients(server.target, setup, options.client_processes, options.channels)
        started = time.monotonic()  # the soak's clock: from its first cycle
        while time.monotonic() - started < limit_seconds and cycles < limit_cycles:
            window = clients.window(
                "cycle",
                options.soak_concurrency,
                options.soak_concurrency,
                options.soak_sample_seconds,
            )
            cycles += window["completed"]
            errors += sum(window["errors"].values())
            sample = {
                "seconds": round(time.monotonic() - started, 1),
                "rss_kib": memory_kib(server.pids()),
                "cycles": cycles,
                "cycles_per_second": round(window["completed"] / window["wall_seconds"], 1),
                "errors": window["errors"],
            }
            samples.append(sample)
            print(
                f"soak: {sample['seconds']} s, {cycles} cycles ({sample['cycles_per_second']}/s), "
                f"RSS {sample['rss_kib'] / 1024:.1f} MiB"
                + (f", errors {window['errors']}" if window["errors"] else ""),
                flush=True,
            )
        peak = memory_kib(server.pids(), "VmHWM")
    finally:
        if clients is not None:
            clients.close()
        server.stop()
        drop_database(options.pg_url, url)
    shutil.rmtree(server.folder, ignore_errors=True)
    warm = next(
        (sample for sample in samples if sample["seconds"] >= options.soak_warmup_minutes * 60),
        samples[-1],
    )
    growth = (samples[-1]["rss_kib"] - warm["rss_kib"]) / warm["rss_kib"] * 100
    return {
        "workers": workers,
        "concurrency": options.soak_concurrency,
        "cycles": cycles,
        "errors": errors,
        "seconds": samples[-1]["seconds"],
        "rss_after_warmup_kib": warm["rss_kib"],
        "rss_after_warmup_at_seconds": warm["seconds"],
        "rss_end_kib": samples[-1]["rss_kib"],
        "growth_percent": round(growth, 2),
        "growth_target_percent": 5.0,
        "met": abs(growth) <= 5.0 and not errors,
        "peak_rss_kib": peak,
        "samples": samples,
    }


def measured_line(report: dict) -> str:
    info = report["machine"]
    return (
        f"Measured {report['measured_at']} on {info['platform']} ({info['cpu']}, "
        f"{info['cpus']} CPUs), PostgreSQL {report['postgres']}, Python {info['python']}"
    )


def soak_markdown(report: dict) -> str:
    result = report["soak"]
    mib = {name: result[name] / 1024 for name in ("rss_after_warmup_kib", "rss_end_kib", "peak_rss_kib")}
    verdict = "met" if result["met"] else "NOT met"
    return (
        f"{measured_line(report)}; command: `{report['command']}`\n\n"
        f"Soak: {result['cycles']} effect cycles in {result['seconds']} s at "
        f"{result['concurrency']} callers, {result['workers']} worker(s), "
        f"{result['errors']} errors. "
        f"Server RSS (summed over processes): {mib['rss_after_warmup_kib']:.1f} MiB after the "
        f"warm-up ({result['rss_after_warmup_at_seconds']} s), {mib['rss_end_kib']:.1f} MiB at the "
        f"end, {result['growth_percent']:+.2f} % (target: within "
        f"{result['growth_target_percent']:g} %, {verdict}); peak {mib['peak_rss_kib']:.1f} MiB.\n"
    )


# --- main -----------------------------------------------------------------------------------


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="See the module docstring for details."
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("EFFECT_LEDGER_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--levels", default="32")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--settled-keys", type=int, default=64)
    parser.add_argument("--out", default="")
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--soak", type=int, default=0)
    parser.add_argument("--soak-concurrency", type=int, default=32)
    parser.add_argument("--soak-warmup-minutes", type=float, default=2.0)
    parser.add_argument("--soak-sample-seconds", type=float, default=10.0)
    options = parser.parse_args()
    unknown = set(options.scenarios.split(",")) - set(SCENARIOS) | set(options.layouts.split(",")) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown scenarios or layouts: {', '.join(sorted(unknown))}")
    return options


def main() -> None:
    options = parse_options()
    report = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "postgres": postgres_version(options.pg_url),
        "command": "python bench/run.py " + shlex.join(sys.argv[1:]),
        "seconds": options.seconds,
        "warmup_seconds": options.warmup_seconds,
        "client_processes": options.client_processes,
        "channels": options.channels,
        "pool_size": options.pool_size,
        "rows": [],
        "servers": [],
        "skipped": [],
    }
    worker_counts = [int(value) for value in options.workers.split(",")]
    has_workers_flag = serve_has_workers_flag()
    runnable = [count for count in worker_counts if count == 1 or has_workers_flag]
    for count in sorted(set(worker_counts) - set(runnable)):
        note = f"--workers {count}: `effect-ledger serve --help` lists no --workers flag here"
        print("skipped " + note, flush=True)
        report["skipped"].append(note)
    if options.soak or options.soak_minutes:
        if not runnable:
            raise SystemExit("no runnable worker count for the soak")
        report["soak"] = soak(options, runnable[0], has_workers_flag)
        text = soak_markdown(report)
        write_report(options.out or str(RESULTS / "soak"), report, text)
    else:
        for workers in runnable:
            for layout in options.layouts.split(","):
                rows, totals = run_group(options, workers, has_workers_flag, layout)
                report["rows"] += rows
                report["servers"].append(totals)
        text = markdown(report)
        write_report(options.out or str(RESULTS / "latest"), report, text)
    print(text)


if __name__ == "__main__":
    main()
