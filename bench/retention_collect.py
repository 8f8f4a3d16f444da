"""The retention collector on many rows: wall time and peak memory of `effect-ledger collect`.

    .venv/bin/python bench/retention_collect.py                    # 100,000 decisions
    .venv/bin/python bench/retention_collect.py --rows 2000        # a quick look

On a fresh PostgreSQL database (``EFFECT_LEDGER_TEST_PG_URL``'s server, as the tests use;
dropped afterwards unless ``--keep``) it bulk-inserts ``--rows`` decisions of one expired run
(``COPY``; each with a policy input of ``--input-bytes``, dated 2000-01-01), sets the tenant's
DECISIONS rule to one hour, and runs ``effect-ledger collect --tenant`` in a child process.
Reported: the collector's wall time, its peak resident memory (``getrusage`` of the child),
the same for a collection with nothing to collect (the process's floor: Python, SQLAlchemy,
psycopg), and the rows left. Bounded memory shows as a peak that does not grow with ``--rows``
(run it with two sizes); bounded time as a rate that does not fall.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "server"))

PG_ADMIN_URL = os.environ.get("EFFECT_LEDGER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/postgres")
TENANT = "bench-retention"
RUN_ID = "run_bench_expired"
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
COPY_COLUMNS = (
    "tenant_id, decision_id, run_id, outcome, reasons, policy_revision, engine, input_digest, input_json, "
    "intent_digest, idempotency_key, principal_id, tool, created_at"
)


def create_database() -> tuple[str, str]:
    import psycopg

    name = f"el_bench_retention_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return name, f"{base}/{name}"


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fill(url: str, rows: int, input_bytes: int) -> float:
    """The expired run, its decisions and the rule; returns the seconds it took."""
    import psycopg

    started = time.monotonic()
    policy_input = json.dumps({"padding": "x" * input_bytes}).encode()
    digest = hashlib.sha256(policy_input).hexdigest()
    with psycopg.connect(url) as connection:
        connection.execute(
            "INSERT INTO runs (tenant_id, run_id, created_by, created_at, revision, head_hash, labels, root_run_id) "
            "VALUES (%s, %s, 'bench', %s, 0, '', '{}', %s)",
            (TENANT, RUN_ID, LONG_AGO, RUN_ID),
        )
        with connection.cursor() as cursor, cursor.copy(f"COPY decisions ({COPY_COLUMNS}) FROM STDIN") as copy:
            for index in range(rows):
                copy.write_row(
                    (
                        TENANT,
                        f"dec_{index:016x}{'0' * 16}",
                        RUN_ID,
                        "ALLOW",
                        "[]",
                        "bench",
                        "embedded",
                        digest,
                        policy_input,
                        digest,
                        f"key-{index}",
                        "agent",
                        "email.send",
                        LONG_AGO,
                    )
                )
        connection.execute(
            "INSERT INTO retention_rules (tenant_id, kind, max_age_seconds, updated_by, updated_at) "
            "VALUES (%s, 'DECISIONS', 3600, 'bench', now())",
            (TENANT,),
        )
        connection.execute("ANALYZE")
    return time.monotonic() - started


def collect(url: str) -> dict[str, float]:
    """`effect-ledger collect` in a child process: its wall time, peak RSS and answer."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "collect", "--database-url", url, "--tenant", TENANT],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "server")},
    )
    seconds = time.monotonic() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest of any child so far: run the smaller job first.
    assert peak_kib >= before
    return {"seconds": seconds, "peak_rss_mib": peak_kib / 1024, **json.loads(done.stdout)}


def left(url: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(url) as connection:
        decisions = connection.execute("SELECT count(*) FROM decisions WHERE tenant_id = %s", (TENANT,)).fetchone()
        tombstones = connection.execute("SELECT count(*) FROM tombstones WHERE tenant_id = %s", (TENANT,)).fetchone()
    assert decisions is not None and tombstones is not None
    return decisions[0], tombstones[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--input-bytes", type=int, default=1024, help="size of each decision's policy input")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    options = parser.parse_args()

    from effect_ledger.cli import _migrate

    name, url = create_database()
    try:
        _migrate(url)
        idle = collect(url)  # nothing to collect yet: the process's floor
        filled = fill(url, options.rows, options.input_bytes)
        result = collect(url)
        remaining, tombstones = left(url)
    finally:
        if not options.keep:
            drop_database(name)
    rate = options.rows / result["seconds"]
    print(f"rows: {options.rows} decisions ({options.input_bytes} B policy input each), inserted in {filled:.1f} s")
    print(f"idle collect: {idle['seconds']:.2f} s, peak RSS {idle['peak_rss_mib']:.0f} MiB (the process's floor)")
    print(
        f"collect: {result['seconds']:.2f} s ({rate:,.0f} decisions/s), peak RSS {result['peak_rss_mib']:.0f} MiB; "
        f"removed {result['decisions']}, tombstones written {result['tombstones_written']}"
    )
    print(f"left: {remaining} decisions, {tombstones} tombstones")
    ok = remaining == 0 and tombstones == options.rows and result["decisions"] == options.rows
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
