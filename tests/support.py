"""Test machinery shared by the suites: real databases, real server processes, real channels."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from effect_ledger.cli import _migrate, add_principal, set_roles
from effect_ledger.client import LedgerClient
from effect_ledger.storage.dialect import normalize_url

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("EFFECT_LEDGER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/postgres")
SERVER_START_TIMEOUT_SECONDS = 30.0


def create_pg_database(prefix: str = "el_test") -> str:
    """A fresh, empty PostgreSQL database; returns its SQLAlchemy URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return normalize_url(f"{base}/{name}")


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def allow_connections(name: str, allowed: bool) -> None:
    """Let a database take connections again, or refuse them and end the ones it has (an outage
    as the server sees it, without stopping PostgreSQL)."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}')
        if not allowed:
            connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


def psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@dataclass
class ServerProcess:
    """``effect-ledger serve`` in its own process, on an ephemeral port."""

    database_url: str
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    port: int = 0
    log_path: Path | None = None
    # ``--workers``: 1 (one process, no supervisor) unless a test asks for more; None leaves the
    # flag out, so the server picks its default (one worker per CPU).
    workers: int | None = 1

    def start(self) -> ServerProcess:
        folder = Path(tempfile.mkdtemp(prefix="el-server-"))
        port_file = folder / "port"
        self.log_path = folder / "server.log"
        command = [
            sys.executable,
            "-m",
            "effect_ledger",
            "serve",
            "--database-url",
            self.database_url,
            "--listen",
            "127.0.0.1:0" if not self.port else f"127.0.0.1:{self.port}",
            "--port-file",
            str(port_file),
            "--grace-seconds",
            "1",
            *(["--workers", str(self.workers)] if self.workers is not None else []),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            command,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            cwd=folder,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                if self.wait_serving(deadline - time.monotonic()):
                    return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not start in time:\n{self.log()}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def health(self, service: str = "", timeout: float = 2.0) -> int:
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status

    def wait_serving(self, timeout: float) -> bool:
        deadline = time.monotonic() + max(timeout, 0.1)
        while time.monotonic() < deadline:
            try:
                if self.health() == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        return False

    def log(self) -> str:
        return self.full_log()[-4000:]

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no goodbye."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> ServerProcess:
        self.kill()
        return self.start()


@dataclass
class Tenant:
    """A tenant of its own for each test: isolation without truncating tables."""

    database_url: str
    name: str
    tokens: dict[str, str] = field(default_factory=dict)

    def add(self, principal_id: str, *roles: str) -> str:
        token = add_principal(self.database_url, self.name, principal_id, list(roles))
        self.tokens[principal_id] = token
        return token

    def set_roles(self, principal_id: str, *roles: str) -> None:
        set_roles(self.database_url, self.name, principal_id, list(roles))

    def client(self, server: ServerProcess, principal_id: str, timeout_seconds: float = 10.0) -> LedgerClient:
        return LedgerClient(server.target, self.tokens[principal_id], timeout_seconds=timeout_seconds)


def new_tenant(database_url: str) -> Tenant:
    tenant = Tenant(database_url, f"t-{uuid.uuid4().hex[:12]}")
    tenant.add("agent", "agent")
    tenant.add("admin", "admin")
    tenant.add("auditor", "auditor")
    tenant.add("reviewer", "reviewer")
    return tenant


def migrate(url: str) -> None:
    _migrate(url)


# --- request builders used across suites ------------------------------------------------------

from effectledger.v1 import common_pb2, gate_pb2, runs_pb2, tools_pb2  # noqa: E402


def contract(
    tool: str = "email.send",
    *,
    effect_class: int = common_pb2.RETRYABLE_WITH_KEY,
    provider_idempotency: bool = True,
    queryable: bool = False,
    allowed_recovery: tuple[int, ...] = (),
    max_attempts: int = 3,
    lease_seconds: int = 60,
    arguments_schema_json: bytes = b"",
) -> tools_pb2.PutToolContractRequest:
    return tools_pb2.PutToolContractRequest(
        contract=tools_pb2.ToolContract(
            tool=tool,
            effect_class=effect_class,
            provider_idempotency=provider_idempotency,
            queryable=queryable,
            allowed_recovery=list(allowed_recovery),
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            arguments_schema_json=arguments_schema_json,
        )
    )


def authorize_request(
    run_id: str,
    key: str,
    *,
    tool: str = "email.send",
    arguments: bytes = b'{"to":"bob@example.com","subject":"hello"}',
    target: str = "mailto:bob@example.com",
) -> gate_pb2.AuthorizeEffectRequest:
    return gate_pb2.AuthorizeEffectRequest(
        run_id=run_id, tool=tool, arguments_json=arguments, idempotency_key=key, target=target
    )


def succeeded(attempt_id: str, reference: str = "provider-ref-1", detail: bytes = b'{"status":"sent"}'):
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id,
        succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
            receipt=common_pb2.Receipt(provider_reference=reference, detail_json=detail)
        ),
    )


def failed(attempt_id: str, evidence: int = gate_pb2.PROVIDER_REJECTED, reason: str = "provider said 400"):
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id, failed=gate_pb2.RecordOutcomeRequest.Failed(reason=reason, evidence=evidence)
    )


def unknown(attempt_id: str, reason: str = "connection reset after sending"):
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id, unknown=gate_pb2.RecordOutcomeRequest.Unknown(reason=reason)
    )


def new_run(client) -> str:
    return client.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id


def outcome_name(response) -> str:
    return common_pb2.Outcome.Name(response.outcome)


def stage_name(value: int) -> str:
    return common_pb2.Stage.Name(value)


import contextlib  # noqa: E402

from effect_ledger.errors import LedgerError  # noqa: E402


@contextlib.contextmanager
def raises_error(code: str, reason: str | None = None):
    """Expect a LedgerError (from LedgerClient) with a gRPC code name and an ErrorInfo reason."""
    try:
        yield
    except LedgerError as error:
        actual_code = error.grpc_code.name  # type: ignore[attr-defined]
        assert actual_code == code, f"expected {code}, got {actual_code} ({error.reason}: {error.message})"
        if reason is not None:
            assert error.reason == reason, f"expected reason {reason}, got {error.reason}: {error.message}"
        raises_error.last = error  # type: ignore[attr-defined]
    else:
        raise AssertionError(f"expected {code} {reason or ''}, but the call succeeded")


def checkpoints_stub(server, token: str):
    """The Checkpoints service through the same error-mapping wrapper as LedgerClient."""
    from effect_ledger.client import _Stub
    from effectledger.v1 import checkpoints_pb2_grpc

    channel = grpc.insecure_channel(server.target)
    return _Stub(checkpoints_pb2_grpc.CheckpointsStub(channel), (("authorization", f"Bearer {token}"),), 10.0)


@contextlib.contextmanager
def servers_on_fresh_database(prefix: str, count: int, extra_args: list[str] | None = None):
    """``count`` server processes on one new, migrated PostgreSQL database, with a tenant:
    yields (database url, servers, tenant); stops the servers and drops the database after."""
    from concurrent.futures import ThreadPoolExecutor

    url = create_pg_database(prefix)
    servers = [ServerProcess(url, list(extra_args or [])) for _ in range(count)]
    try:
        migrate(url)
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(ServerProcess.start, servers))
        yield url, servers, new_tenant(url)
    finally:
        for server in servers:
            server.stop()
        drop_pg_database(url)


def reload_policy(server: ServerProcess, timeout_seconds: float = 10.0) -> None:
    """SIGHUP: the server reloads its policy folder; returns once its log says it did."""
    before = server.log().count("policy reloaded")
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout_seconds
    while server.log().count("policy reloaded") <= before:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)


def not_happened(effect_id: str, reason: str = "the provider has no record of it", *, lookup: bool = False):
    """ReconcileEffect(not_happened); ``lookup``: with a provider lookup as structured evidence
    (what an attempt's own principal needs, for a QUERY_THEN_RETRY tool)."""
    evidence = gate_pb2.ReconcileEffectRequest.NotHappened(reason=reason)
    if lookup:
        evidence.lookup_reference = f"lookup-{effect_id}"
        evidence.lookup_result_json = b'{"found":false}'
    return gate_pb2.ReconcileEffectRequest(effect_id=effect_id, not_happened=evidence)


def rss_kib(pid: int) -> int:
    """A process's resident memory now (KiB), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# --- the fuzzer's seed (tests/e2e/test_fuzz.py), also printed in the report header -----------

FUZZ_SEED_ENV = "EFFECT_LEDGER_FUZZ_SEED"


def fuzz_seed() -> int:
    """``EFFECT_LEDGER_FUZZ_SEED`` when set; otherwise the checked-out commit's (each commit
    explores requests of its own, and a run on the same commit, CI's say, replays the same
    ones), or outside a git checkout a random one. The seed chosen is set in the environment,
    so the report header, this process and pytest-xdist's workers (started later, with this
    environment) all use the same one."""
    value = os.environ.get(FUZZ_SEED_ENV, "").strip()
    if value:
        return int(value)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=REPO,
        ).stdout.strip()
        chosen = int(head[:8], 16)
    except (OSError, subprocess.SubprocessError, ValueError):
        import random  # only outside a git checkout

        chosen = random.SystemRandom().randrange(2**32)
    os.environ[FUZZ_SEED_ENV] = str(chosen)
    return chosen
