"""Benchmark: the full effect cycle against a server on PostgreSQL, compared with a trivial RPC.

    .venv/bin/python bench/run.py                       # levels 1, 8, 32, 128; 10 s each
    .venv/bin/python bench/run.py --levels 32 --seconds 20
    .venv/bin/python bench/run.py --soak 200000         # memory over 200,000 effect cycles

It starts its own server process on a fresh PostgreSQL database (``--pg-url`` names the admin
connection, default ``postgresql://root@127.0.0.1:5432/postgres``), drives it from several
client processes (grpc.aio), and writes ``bench/results/latest.json`` and
``bench/results/latest.md``. For each concurrency level it measures, in this order:

- ``health``: ``grpc.health.v1.Health/Check``, the baseline of what the server and this machine
  do for a trivial RPC with the same clients;
- ``cycle``: AuthorizeEffect (with an estimate against a budget) + RecordDispatch +
  RecordOutcome (with a receipt), each call timed on its own;
- ``duplicate``: AuthorizeEffect on keys already settled (answers DUPLICATE);
- ``deny``: AuthorizeEffect for a tool that is not registered (answers DENY).

Ratios compare throughputs with the health baseline at the same level, so results compare
across noisy machines. Server CPU (user + system seconds per second) and peak RSS come from
/proc. Clients run on the same machine and take CPU from the server: the ratios include that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CLIENT_PROCESSES = 2


# --- the server under test ------------------------------------------------------------------


@dataclass
class Server:
    database_url: str
    pool_size: int
    process: subprocess.Popen | None = None
    port: int = 0
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="el-bench-")))

    def start(self) -> None:
        port_file = self.folder / "port"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "effect_ledger", "--log-level", "WARNING", "serve",
             "--database-url", self.database_url, "--listen", "127.0.0.1:0", "--port-file", str(port_file),
             "--database-pool-size", str(self.pool_size), "--maximum-concurrent-rpcs", "1000"],
            stdout=(self.folder / "server.log").open("ab"), stderr=subprocess.STDOUT, cwd=self.folder,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                time.sleep(0.5)
                return
            if self.process.poll() is not None:
                raise SystemExit((self.folder / "server.log").read_text())
            time.sleep(0.05)
        raise SystemExit("the server did not start")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kib(self, field_name: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)


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


def prepare(url: str, target: str) -> dict:
    """Principals, a contract, a budget large enough never to run out, a run, settled keys."""
    import grpc

    from effect_ledger.cli import _migrate, add_principal
    from effectledger.v1 import budgets_pb2, budgets_pb2_grpc, common_pb2, gate_pb2, gate_pb2_grpc, runs_pb2, runs_pb2_grpc, tools_pb2, tools_pb2_grpc

    _migrate(url)
    tenant = f"bench-{uuid.uuid4().hex[:6]}"
    admin = add_principal(url, tenant, "admin", ["admin"])
    agent = add_principal(url, tenant, "agent", ["agent"])
    channel = grpc.insecure_channel(target)
    admin_md = (("authorization", f"Bearer {admin}"),)
    agent_md = (("authorization", f"Bearer {agent}"),)
    tools_pb2_grpc.ToolRegistryStub(channel).PutToolContract(
        tools_pb2.PutToolContractRequest(contract=tools_pb2.ToolContract(
            tool="email.send", effect_class=common_pb2.RETRYABLE_WITH_KEY, provider_idempotency=True,
            max_attempts=3, lease_seconds=300)), metadata=admin_md, timeout=10)
    budgets_pb2_grpc.BudgetsStub(channel).PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="usd_micros", limit=2**62), metadata=admin_md, timeout=10)
    run_id = runs_pb2_grpc.RunsStub(channel).CreateRun(runs_pb2.CreateRunRequest(), metadata=agent_md, timeout=10).run_id
    gate = gate_pb2_grpc.GateStub(channel)
    settled = []
    for index in range(50):
        key = f"settled-{index}"
        allowed = gate.AuthorizeEffect(gate_pb2.AuthorizeEffectRequest(
            run_id=run_id, tool="email.send", arguments_json=b'{"n":%d}' % index, idempotency_key=key,
            target=f"mailto:settled-{index}@example.com"), metadata=agent_md, timeout=10)
        gate.RecordOutcome(gate_pb2.RecordOutcomeRequest(attempt_id=allowed.attempt_id, succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
            receipt=common_pb2.Receipt(provider_reference=f"ref-{index}"))), metadata=agent_md, timeout=10)
        settled.append((key, index))
    channel.close()
    return {"token": agent, "run_id": run_id, "settled": settled}


# --- clients --------------------------------------------------------------------------------


async def _client(target: str, scenario: str, setup: dict, concurrency: int, seconds: float, worker: int) -> dict:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from effectledger.v1 import common_pb2, gate_pb2, gate_pb2_grpc

    metadata = (("authorization", f"Bearer {setup['token']}"),)
    latencies: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    completed = 0
    async with grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        gate = gate_pb2_grpc.GateStub(channel)

        async def timed(name: str, call):
            start = time.perf_counter()
            try:
                response = await call
            except grpc.aio.AioRpcError as error:
                errors[f"{name}:{error.code().name}"] = errors.get(f"{name}:{error.code().name}", 0) + 1
                return None
            latencies.setdefault(name, []).append(time.perf_counter() - start)
            return response

        async def loop(lane: int) -> None:
            nonlocal completed
            sequence = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                sequence += 1
                if scenario == "health":
                    if await timed("Health/Check", health.Check(health_pb2.HealthCheckRequest(), timeout=10)):
                        completed += 1
                elif scenario == "cycle":
                    key = f"w{worker}-l{lane}-{sequence}-{uuid.uuid4().hex[:6]}"
                    request = gate_pb2.AuthorizeEffectRequest(
                        run_id=setup["run_id"], tool="email.send", arguments_json=b'{"subject":"bench"}',
                        idempotency_key=key, target=f"mailto:{key}@example.com", estimate={"usd_micros": 250})
                    allowed = await timed("AuthorizeEffect", gate.AuthorizeEffect(request, metadata=metadata, timeout=10))
                    if allowed is None or allowed.outcome != common_pb2.ALLOW:
                        continue
                    if await timed("RecordDispatch", gate.RecordDispatch(
                            gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id), metadata=metadata, timeout=10)) is None:
                        continue
                    outcome = gate_pb2.RecordOutcomeRequest(
                        attempt_id=allowed.attempt_id,
                        succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
                            receipt=common_pb2.Receipt(provider_reference=key, detail_json=b'{"ok":true}'),
                            usage={"usd_micros": 200}))
                    if await timed("RecordOutcome", gate.RecordOutcome(outcome, metadata=metadata, timeout=10)):
                        completed += 1
                elif scenario == "duplicate":
                    key, index = setup["settled"][(lane + sequence) % len(setup["settled"])]
                    request = gate_pb2.AuthorizeEffectRequest(
                        run_id=setup["run_id"], tool="email.send", arguments_json=b'{"n":%d}' % index,
                        idempotency_key=key, target=f"mailto:settled-{index}@example.com")
                    answer = await timed("AuthorizeEffect(duplicate)", gate.AuthorizeEffect(request, metadata=metadata, timeout=10))
                    if answer is not None and answer.outcome == common_pb2.DUPLICATE:
                        completed += 1
                elif scenario == "deny":
                    key = f"deny-w{worker}-l{lane}-{sequence}"
                    request = gate_pb2.AuthorizeEffectRequest(
                        run_id=setup["run_id"], tool="not.registered", arguments_json=b"{}",
                        idempotency_key=key, target="x")
                    answer = await timed("AuthorizeEffect(deny)", gate.AuthorizeEffect(request, metadata=metadata, timeout=10))
                    if answer is not None and answer.outcome == common_pb2.DENY:
                        completed += 1

        await asyncio.gather(*(loop(lane) for lane in range(concurrency)))
    return {"latencies": latencies, "errors": errors, "completed": completed}


def _client_process(arguments: tuple) -> dict:
    return asyncio.run(_client(*arguments))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_scenario(server: Server, setup: dict, scenario: str, concurrency: int, seconds: float) -> dict:
    processes = min(CLIENT_PROCESSES, concurrency)
    lanes = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    cpu_before, wall_before = server.cpu_seconds(), time.monotonic()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        parts = pool.map(
            _client_process,
            [(f"127.0.0.1:{server.port}", scenario, setup, lanes[i], seconds, i) for i in range(processes)],
        )
    wall = time.monotonic() - wall_before
    cpu = server.cpu_seconds() - cpu_before
    latencies: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for part in parts:
        for name, values in part["latencies"].items():
            latencies.setdefault(name, []).extend(values)
        for name, count in part["errors"].items():
            errors[name] = errors.get(name, 0) + count
    completed = sum(part["completed"] for part in parts)
    return {
        "scenario": scenario,
        "concurrency": concurrency,
        "seconds": round(wall, 2),
        "completed": completed,
        "throughput_per_second": round(completed / seconds, 1),
        "server_cpu_per_second": round(cpu / wall, 2),
        "errors": errors,
        "rpcs": {
            name: {
                "count": len(values),
                "per_second": round(len(values) / seconds, 1),
                "p50_ms": round(statistics.median(values) * 1000, 2),
                "p95_ms": round(percentile(values, 0.95) * 1000, 2),
                "p99_ms": round(percentile(values, 0.99) * 1000, 2),
            }
            for name, values in sorted(latencies.items())
        },
    }


# --- reports --------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    lines = [
        f"Measured {report['measured_at']} on {report['machine']}, {report['cpus']} CPUs, "
        f"{report['seconds_per_scenario']} s per scenario, {CLIENT_PROCESSES} client processes, "
        f"server pool {report['pool_size']}; command: `{report['command']}`",
        "",
        "| clients | scenario | ops/s | ratio to health | RPC | p50 ms | p95 ms | p99 ms | server CPU/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level in report["levels"]:
        baseline = level["health"]["throughput_per_second"] if "health" in level else 0
        for scenario in ("health", "cycle", "duplicate", "deny"):
            if scenario not in level:
                continue
            result = level[scenario]
            for index, (name, rpc) in enumerate(result["rpcs"].items()):
                if scenario == "cycle" and name == "AuthorizeEffect" and baseline:
                    ratio = f"{rpc['per_second'] / baseline:.3f} (Authorize)"
                else:
                    ratio = ""
                first = index == 0
                scenario_ratio = "%.3f" % (result["throughput_per_second"] / baseline) if first and baseline else ""
                cells = [
                    str(level["concurrency"]) if first else "",
                    scenario if first else "",
                    str(result["throughput_per_second"]) if first else "",
                    f"{scenario_ratio} {ratio}".strip(),
                    name,
                    str(rpc["p50_ms"]),
                    str(rpc["p95_ms"]),
                    str(rpc["p99_ms"]),
                    str(result["server_cpu_per_second"]) if first else "",
                ]
                lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Server peak RSS (VmHWM): {report['server_peak_rss_kib'] / 1024:.1f} MiB.")
    if report.get("soak"):
        soak = report["soak"]
        lines.append(
            f"Soak: {soak['cycles']} cycles in {soak['seconds']} s; RSS after warm-up "
            f"{soak['rss_after_warmup_kib'] / 1024:.1f} MiB, at the end {soak['rss_end_kib'] / 1024:.1f} MiB "
            f"({soak['growth_percent']:+.1f} %)."
        )
    return "\n".join(lines) + "\n"


def soak(server: Server, setup: dict, cycles: int, concurrency: int) -> dict:
    """Run effect cycles until ``cycles`` complete, sampling the server's RSS every second."""
    samples: list[tuple[float, int]] = []
    done = 0
    start = time.monotonic()
    chunk_seconds = 10.0
    while done < cycles:
        result = run_scenario(server, setup, "cycle", concurrency, chunk_seconds)
        done += result["completed"]
        samples.append((round(time.monotonic() - start, 1), server.memory_kib()))
        print(f"soak: {done} cycles, RSS {samples[-1][1] / 1024:.1f} MiB", flush=True)
    warm = samples[min(2, len(samples) - 1)][1]
    end = samples[-1][1]
    return {
        "cycles": done,
        "seconds": round(time.monotonic() - start, 1),
        "rss_samples_kib": samples,
        "rss_after_warmup_kib": warm,
        "rss_end_kib": end,
        "growth_percent": round((end - warm) / warm * 100, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("EFFECT_LEDGER_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/postgres"))
    parser.add_argument("--levels", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--scenarios", default="health,cycle,duplicate,deny")
    parser.add_argument("--soak", type=int, default=0, help="run this many effect cycles and report memory")
    parser.add_argument("--soak-concurrency", type=int, default=32)
    parser.add_argument("--out", default=str(RESULTS / "latest"))
    options = parser.parse_args()
    url = create_database(options.pg_url)
    server = Server(url, options.pool_size)
    try:
        from effect_ledger.cli import _migrate

        _migrate(url)
        server.start()
        setup = prepare(url, f"127.0.0.1:{server.port}")
        report = {
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "seconds_per_scenario": options.seconds,
            "pool_size": options.pool_size,
            "command": "python bench/run.py " + " ".join(sys.argv[1:]),
            "levels": [],
        }
        if not options.soak:
            for level in [int(value) for value in options.levels.split(",")]:
                results = {}
                for scenario in options.scenarios.split(","):
                    results[scenario] = run_scenario(server, setup, scenario, level, options.seconds)
                    print(json.dumps({k: v for k, v in results[scenario].items() if k != "rpcs"}), flush=True)
                report["levels"].append({"concurrency": level, **results})
        else:
            report["soak"] = soak(server, setup, options.soak, options.soak_concurrency)
        report["server_peak_rss_kib"] = server.memory_kib("VmHWM")
    finally:
        server.stop()
        drop_database(options.pg_url, url)
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(options.out + ".json").write_text(json.dumps(report, indent=2) + "\n")
    Path(options.out + ".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
