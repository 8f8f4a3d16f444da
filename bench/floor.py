"""The floor: what a gRPC AuthorizeEffect in this stack costs before any ledger logic.

    .venv/bin/python bench/floor.py                  # every level, 10 s windows
    .venv/bin/python bench/floor.py --seconds 5 --levels echo,rego

``bench/run.py`` measures the product. This measures skeleton servers built from the same
parts (grpc.aio with the same health servicer, psycopg 3 on the same PostgreSQL, the embedded
Rego engine with the real policy) that do *less* than any correct gate can do, each beside
its own health window, driven by the same client processes and callers as ``run.py``. A
level's ratio to health is therefore an upper bound for the product on this machine: a gate
that does the level's work and more cannot beat it.

Levels (each one adds to the one before):

- ``echo``: AuthorizeEffect answers ALLOW at once: gRPC and protobuf only;
- ``read``: plus one database round trip, a prepared ``SELECT`` of one short row by its
  primary key, from a pool of psycopg connections (the "read once");
- ``write``: plus a second round trip that inserts one row (the policy input, as the decision
  record keeps it) in autocommit (the "write once": a durable commit, as the ledger must make
  before it answers ALLOW);
- ``rego``: plus one evaluation of the real policy (``policy/``) by the embedded engine, on a
  policy input captured from the product (serialized once, as the product does);
- ``product``: the real ``effect-ledger serve`` on the same database, as ``run.py`` runs it.

The skeleton parses nothing, authenticates nothing, canonicalizes nothing and writes one
small row instead of an effect, an attempt, reservations, a decision, events and a run head.
Results: ``bench/results/floor.md`` and ``floor.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench

LEVELS = ("echo", "read", "write", "rego", "product")
POOL_SIZE = 10


# --- the skeleton server (``floor.py --serve LEVEL``) ---------------------------------------


async def serve(level: str, database_url: str, port_file: Path, input_file: Path) -> None:
    import grpc
    import psycopg
    from grpc_health.v1 import health, health_pb2_grpc

    from effect_ledger.policy.embedded import EmbeddedRegoEngine
    from effectledger.v1 import common_pb2, gate_pb2, gate_pb2_grpc

    connections: asyncio.Queue = asyncio.Queue()
    if level != "echo":
        for _ in range(POOL_SIZE):
            connection = await psycopg.AsyncConnection.connect(database_url, autocommit=True, prepare_threshold=0)
            await connections.put(connection)
    engine = EmbeddedRegoEngine(bench.REPO / "policy") if level == "rego" else None
    input_bytes = input_file.read_bytes() if input_file.exists() else b"{}"
    sequence = 0

    class Gate(gate_pb2_grpc.GateServicer):
        async def AuthorizeEffect(self, request, context):
            nonlocal sequence
            sequence += 1
            number = sequence
            if level != "echo":
                connection = await connections.get()
                try:
                    cursor = connection.cursor()
                    # Autocommit: the read is one round trip, the write (and its commit) one more.
                    await cursor.execute(
                        "SELECT run_id, tenant_id FROM floor_runs WHERE run_id = %s",
                        (request.run_id,),
                    )
                    await cursor.fetchone()
                    if engine is not None:
                        await engine.evaluate({}, input_bytes)
                    if level != "read":
                        await cursor.execute(
                            "INSERT INTO floor_decisions (decision_id, run_id, input) VALUES (%s, %s, %s)",
                            (f"{os.getpid()}-{number}", request.run_id, input_bytes),
                        )
                finally:
                    connections.put_nowait(connection)
            return gate_pb2.AuthorizeEffectResponse(
                outcome=common_pb2.ALLOW, effect_id="eff", attempt_id=f"att-{number}"
            )

    server = grpc.aio.server(maximum_concurrent_rpcs=1000)
    gate_pb2_grpc.add_GateServicer_to_server(Gate(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


class Skeleton(bench.Server):
    """A skeleton server process, measured as ``run.py`` measures the product (no round-trip
    counts: each level's round trips are fixed by its code above)."""

    level: str = "echo"
    input_file: Path = Path("/nonexistent")

    def start(self) -> None:
        port_file = self.folder / "port"
        arguments = [
            sys.executable,
            __file__,
            "--serve",
            self.level,
            "--database-url",
            self.database_url,
        ]
        arguments += ["--port-file", str(port_file), "--input-file", str(self.input_file)]
        self.process = subprocess.Popen(
            arguments,
            cwd=self.folder,
            stdout=(self.folder / "server.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + bench.SERVER_START_TIMEOUT_SECONDS
        while not (port_file.exists() and port_file.read_text().strip()):
            self._check_alive(deadline)
        self.port = int(port_file.read_text())
        self._wait_serving(deadline)

    def snapshot(self) -> tuple[list[int], dict]:
        return [], {}


# --- the driver -----------------------------------------------------------------------------


def captured_input(url: str, setup: dict) -> bytes:
    """The policy input of a real ALLOW decision of the product (the one the last window made)."""
    import psycopg

    with psycopg.connect(url) as connection:
        row = connection.execute(
            "SELECT input_json FROM decisions WHERE outcome = 'ALLOW' ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
    assert row is not None, "the product window made no ALLOW decision"
    return bytes(row[0])


def skeleton_tables(url: str, run_ids: list[str]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS floor_runs (run_id text PRIMARY KEY, tenant_id text NOT NULL)")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS floor_decisions (decision_id text PRIMARY KEY, run_id text NOT NULL, "
            "input bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO floor_runs VALUES (%s, 'bench') ON CONFLICT DO NOTHING",
                [(r,) for r in run_ids],
            )


def measure_level(server: bench.Server, clients: bench.Clients, callers: int, seconds: float, warmup: float) -> dict:
    if warmup > 0:
        clients.window("authorize", callers, callers, warmup)
    health = bench.measure(server, clients, "health", callers, callers, seconds)
    result = bench.measure(server, clients, "authorize", callers, callers, seconds)
    return {
        "ops_per_second": result["ops_per_second"],
        "health_ops_per_second": health["ops_per_second"],
        "ratio_to_health": round(result["ops_per_second"] / health["ops_per_second"], 3),
        "server_cpu_ms_per_op": result["server_cpu_ms_per_op"],
        "health_cpu_ms_per_op": health["server_cpu_ms_per_op"],
        "latency": result["rpcs"].get("AuthorizeEffect"),
        "errors": result["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=LEVELS[:-1])
    parser.add_argument("--database-url", default="")
    parser.add_argument("--port-file", default="")
    parser.add_argument("--input-file", default="")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("EFFECT_LEDGER_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--levels", default=",".join(LEVELS))
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--out", default=str(bench.RESULTS / "floor"))
    options = parser.parse_args()
    if options.serve:
        asyncio.run(
            serve(
                options.serve,
                options.database_url,
                Path(options.port_file),
                Path(options.input_file),
            )
        )
        return
    levels = [level for level in options.levels.split(",") if level]
    if set(levels) - set(LEVELS):
        parser.error(f"unknown levels: {sorted(set(levels) - set(LEVELS))}")
    url = bench.create_database(options.pg_url)
    folder = Path(tempfile.mkdtemp(prefix="el-floor-"))
    input_file = folder / "input.json"
    rows: dict[str, dict] = {}
    try:
        from effect_ledger.cli import _migrate

        _migrate(url)
        # The product first: it prepares the runs and makes the decision whose input the
        # ``rego`` level evaluates.
        product = bench.Server(url, POOL_SIZE, 1, bench.serve_has_workers_flag(), count_round_trips=False)
        product.start()
        try:
            setup = bench.prepare(url, product.target, options.callers, 2 * options.callers)
            clients = bench.Clients(product.target, setup, 2, 4)
            try:
                if "product" in levels:
                    rows["product"] = measure_level(
                        product, clients, options.callers, options.seconds, options.warmup_seconds
                    )
                else:
                    clients.window("authorize", options.callers, options.callers, 1.0)
            finally:
                clients.close()
        finally:
            product.stop()
        input_file.write_bytes(captured_input(url, setup))
        skeleton_tables(url, setup["runs"])
        for level in [value for value in LEVELS if value in levels and value != "product"]:
            server = Skeleton(url, POOL_SIZE)
            server.level, server.input_file = level, input_file
            server.start()
            clients = bench.Clients(server.target, setup, 2, 4)
            try:
                rows[level] = measure_level(server, clients, options.callers, options.seconds, options.warmup_seconds)
                print(level, rows[level], flush=True)
            finally:
                clients.close()
                server.stop()
    finally:
        bench.drop_database(options.pg_url, url)
    report = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": bench.machine(),
        "postgres": bench.postgres_version(options.pg_url),
        "command": "python bench/floor.py " + shlex.join(sys.argv[1:]),
        "callers": options.callers,
        "seconds": options.seconds,
        "input_bytes": input_file.stat().st_size,
        "rows": rows,
    }
    text = markdown(report)
    bench.write_report(options.out, report, text)
    print(text)


def markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        (
            f"Measured {report['measured_at']} on {machine.get('platform', '')} "
            f"({machine.get('cpu', '')}, {machine.get('cpus', '')} CPUs), {report['postgres']}."
        ),
        "",
        f"Command: `{report['command']}`",
        "",
        (
            f"{report['callers']} callers on as many runs, 2 client processes with 4 connections "
            f"each, {report['seconds']} s windows; each level's ratio is to the health window of "
            "the same server just before it. The policy input evaluated by `rego` is "
            f"{report['input_bytes']} bytes, captured from a decision of the product."
        ),
        "",
        (
            "| level | AuthorizeEffect ops/s | health ops/s | ratio to health | server CPU ms/op "
            "| health CPU ms/op | p50 / p99 ms | errors |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for level, row in report["rows"].items():
        latency = row["latency"] or {}
        lines.append(
            f"| {level} | {row['ops_per_second']} | {row['health_ops_per_second']} | {row['ratio_to_health']} "
            f"| {row['server_cpu_ms_per_op']} | {row['health_cpu_ms_per_op']} "
            f"| {latency.get('p50_ms')} / {latency.get('p99_ms')} | {row['errors'] or 'none'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
