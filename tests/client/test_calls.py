"""Calls through the client: typed exceptions (unary and streams, sync and asyncio), retries
that honour RetryInfo for the calls that are safe to repeat and only for those, and TLS."""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path

import grpc
import pytest

from effect_ledger_client import (
    AsyncLedger,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    Ledger,
    LedgerError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
    _services,
)
from effect_ledger_client.proto import approvals_pb2, common_pb2, gate_pb2, runs_pb2
from support import ServerProcess, new_tenant

FORGED_TOKEN = "elt_forged_" + "x" * 40


# --- typed exceptions ----------------------------------------------------------------------------


def test_unary_errors_carry_code_reason_metadata_and_violations(ledger, admin_ledger, run_id):
    with pytest.raises(InvalidArgument) as invalid:
        ledger.gate.AuthorizeEffect(
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id, tool="t", idempotency_key="k", target="x", arguments_json=b"[1"
            )
        )
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT and invalid.value.reason
    assert invalid.value.violations and isinstance(invalid.value.violations[0], FieldViolation)
    assert invalid.value.violations[0].field == "arguments_json"

    with pytest.raises(NotFound) as missing:
        ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id="eff_missing"))
    assert missing.value.code == grpc.StatusCode.NOT_FOUND and missing.value.metadata["resource_name"] == "eff_missing"

    with pytest.raises(PermissionDenied) as denied:
        admin_ledger.gate.AuthorizeEffect(
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id, tool="t", idempotency_key="k", target="x", arguments_json=b"{}"
            )
        )
    assert denied.value.reason == "ROLE_REQUIRED"


def test_a_precondition_failure_is_typed(ledger, admin_ledger, run_id):
    from .conftest import register

    register(admin_ledger)
    with ledger.guard(run_id, "email.send", {"a": 1}, key="k1") as effect:
        effect.succeeded("ref")
    with pytest.raises(FailedPrecondition) as refused:
        ledger.gate.AuthorizeEffect(
            gate_pb2.AuthorizeEffectRequest(
                run_id=run_id, tool="email.send", idempotency_key="k1", target="email.send", arguments_json=b'{"a":2}'
            )
        )
    assert refused.value.reason == "IDEMPOTENCY_KEY_REUSED" and refused.value.metadata["effect_id"] == effect.effect_id


def test_a_stream_with_a_forged_token_raises_unauthenticated(server):
    with Ledger(server.target, FORGED_TOKEN) as forged:
        stream = forged.approvals.WatchApprovals(approvals_pb2.WatchApprovalsRequest(), timeout=5)
        with pytest.raises(Unauthenticated) as refused:
            next(iter(stream))
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED and isinstance(refused.value, LedgerError)


async def test_an_async_stream_with_a_forged_token_raises_unauthenticated(server):
    forged = AsyncLedger(server.target, FORGED_TOKEN)
    try:
        with pytest.raises(Unauthenticated):
            async for _ in forged.approvals.WatchApprovals(approvals_pb2.WatchApprovalsRequest(), timeout=5):
                pass
        with pytest.raises(Unauthenticated):
            await forged.runs.GetRun(runs_pb2.GetRunRequest(run_id="run_x"))
    finally:
        await forged.close()


def test_an_unreachable_server_is_unavailable():
    nowhere = Ledger("127.0.0.1:1", "token", timeout_seconds=2, retry=RetryPolicy(attempts_max=1))
    with nowhere, pytest.raises(Unavailable) as refused:
        nowhere.runs.GetRun(runs_pb2.GetRunRequest(run_id="run_x"))
    assert refused.value.reason == "UNAVAILABLE"


# --- retries -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(sqlite_url):
    """A server whose tokens may make two calls, then two a second (RATE_LIMITED, RetryInfo)."""
    running = ServerProcess(
        sqlite_url, ["--requests-per-second-per-token", "2", "--request-burst-per-token", "2"]
    ).start()
    yield running, new_tenant(sqlite_url)
    running.stop()


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Every wait of the client's retry loop, recorded (and slept)."""
    recorded: list[float] = []

    def sleep(seconds: float) -> None:
        recorded.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(_services, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    return recorded


def drained(ledger: Ledger, run_id: str) -> ResourceExhausted:
    """Spend the token's burst; return the refusal that follows (from a client that never retries)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            ledger.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        except ResourceExhausted as refusal:
            return refusal
    raise AssertionError("the rate limit never refused a call")


def test_a_rate_limited_read_is_retried_after_the_retry_info_delay(limited, sleeps):
    server, tenant = limited
    token = tenant.tokens["agent"]
    with (
        Ledger(server.target, token, retry=RetryPolicy(attempts_max=1)) as once,
        Ledger(server.target, token) as retrying,
    ):
        time.sleep(1.5)  # a full bucket
        run_id = once.runs.CreateRun(runs_pb2.CreateRunRequest(request_id="r1")).run_id
        refusal = drained(once, run_id)
        assert refusal.reason == "RATE_LIMITED" and refusal.retry_after_seconds and refusal.retry_after_seconds > 0.1
        assert sleeps == []  # attempts_max=1: never retried
        started = time.monotonic()
        run = retrying.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        waited = time.monotonic() - started
    assert run.run_id == run_id
    # Refused once, waited out the RetryInfo delay (with at most a tenth more of jitter), then served.
    assert len(sleeps) == 1, sleeps
    assert refusal.retry_after_seconds * 0.5 <= sleeps[0] <= refusal.retry_after_seconds * 1.1 + 0.05
    assert waited >= sleeps[0]


async def test_an_async_rate_limited_read_is_retried_after_the_retry_info_delay(limited, monkeypatch):
    """The asyncio client's retry loop: the same rule as the sync one, with asyncio.sleep."""
    server, tenant = limited
    token = tenant.tokens["agent"]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(seconds)

    monkeypatch.setattr(_services, "asyncio", types.SimpleNamespace(sleep=sleep))
    retrying = AsyncLedger(server.target, token)
    try:
        with Ledger(server.target, token, retry=RetryPolicy(attempts_max=1)) as once:
            await asyncio.sleep(1.5)  # a full bucket
            run_id = once.runs.CreateRun(runs_pb2.CreateRunRequest(request_id="r-async")).run_id
            refusal = drained(once, run_id)
        assert refusal.reason == "RATE_LIMITED" and refusal.retry_after_seconds and refusal.retry_after_seconds > 0.1
        run = await retrying.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        assert run.run_id == run_id
        assert len(sleeps) == 1, sleeps
        assert refusal.retry_after_seconds * 0.5 <= sleeps[0] <= refusal.retry_after_seconds * 1.1 + 0.05
        # Not safe to repeat: refused once, raised at once.
        with Ledger(server.target, token, retry=RetryPolicy(attempts_max=1)) as once:
            drained(once, run_id)
        with pytest.raises(ResourceExhausted):
            await retrying.runs.CreateRun(runs_pb2.CreateRunRequest())
        assert len(sleeps) == 1
    finally:
        await retrying.close()


@pytest.fixture(scope="module")
def policy_outage(sqlite_url):
    """A server whose policy engine is a remote OPA (the stand-in of tests/opa_standin.py), which
    a test can make fail: the gate then answers UNAVAILABLE (POLICY_UNAVAILABLE) with RetryInfo."""
    from opa_standin import OpaStandIn

    from effect_ledger.policy.engine import default_policy_dir

    opa = OpaStandIn(default_policy_dir()).start()
    running = ServerProcess(sqlite_url, ["--opa-url", opa.url, "--opa-timeout-seconds", "0.5"]).start()
    yield opa, running, new_tenant(sqlite_url)
    running.stop()
    opa.stop()


def test_an_unavailable_authorize_is_retried_after_the_retry_info_delay(policy_outage, monkeypatch):
    """Nothing is decided while the policy engine is down: the client waits out the server's
    RetryInfo delay, asks again, and gets the decision once the engine is back."""
    opa, server, tenant = policy_outage
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the engine comes back while the client waits
        sleeps.append(seconds)
        opa.set_mode("normal")
        time.sleep(seconds)

    monkeypatch.setattr(_services, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    token = tenant.tokens["agent"]
    with (
        Ledger(server.target, tenant.tokens["admin"]) as admin,
        Ledger(server.target, token, retry=RetryPolicy(attempts_max=1)) as once,
        Ledger(server.target, token) as retrying,
    ):
        from .conftest import register

        register(admin)
        run_id = once.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        request = gate_pb2.AuthorizeEffectRequest(
            run_id=run_id, tool="email.send", idempotency_key="k1", target="mailto:bob", arguments_json=b"{}"
        )
        opa.set_mode("http500")
        try:
            with pytest.raises(Unavailable) as refused:
                once.gate.AuthorizeEffect(request)
            delay = refused.value.retry_after_seconds
            assert refused.value.reason == "POLICY_UNAVAILABLE" and delay and sleeps == []
            allowed = retrying.gate.AuthorizeEffect(request)
        finally:
            opa.set_mode("normal")
    assert common_pb2.Outcome.Name(allowed.outcome) == "ALLOW"
    assert len(sleeps) == 1 and delay <= sleeps[0] <= delay * 1.1, (sleeps, delay)


def test_a_call_that_is_not_idempotent_is_not_retried(limited, sleeps):
    server, tenant = limited
    token = tenant.tokens["agent"]
    with (
        Ledger(server.target, token, retry=RetryPolicy(attempts_max=1)) as once,
        Ledger(server.target, token) as retrying,
    ):
        time.sleep(1.5)
        run_id = once.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        drained(once, run_id)
        with pytest.raises(ResourceExhausted) as refused:
            retrying.runs.CreateRun(runs_pb2.CreateRunRequest())  # no request_id: a second run
        assert refused.value.reason == "RATE_LIMITED" and sleeps == []
        # The same call with a request_id names one run: it is retried.
        named = retrying.runs.CreateRun(runs_pb2.CreateRunRequest(request_id="named-1"))
    assert named.run_id and len(sleeps) >= 1


def test_the_retry_policy_bounds_attempts_and_total_time(sleeps):
    with Ledger(
        "127.0.0.1:1", "token", timeout_seconds=1, retry=RetryPolicy(attempts_max=3, backoff_initial_seconds=0.05)
    ) as nowhere:
        with pytest.raises(Unavailable):
            nowhere.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id="eff_x"))
        assert len(sleeps) == 2  # three attempts
        with pytest.raises(Unavailable):
            nowhere.gate.ReconcileEffect(gate_pb2.ReconcileEffectRequest(effect_id="eff_x"))
        assert len(sleeps) == 2  # not safe to repeat: one attempt
    with Ledger(
        "127.0.0.1:1",
        "token",
        timeout_seconds=1,
        retry=RetryPolicy(attempts_max=100, backoff_initial_seconds=0.2, total_seconds_max=0.5),
    ) as bounded:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            bounded.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id="eff_x"))
        assert time.monotonic() - started < 2.0


# --- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from e2e.test_tls import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mtls_server(pki, sqlite_url):
    from e2e.test_tls import TlsServerProcess, credentials, tls_flags

    running = TlsServerProcess(
        sqlite_url,
        [*tls_flags(pki), "--tls-client-ca", pki.path("ca.pem")],
        channel_credentials=credentials(pki, "client"),
    ).start()
    yield running
    running.stop()


def test_tls_options_as_paths_and_as_bytes(mtls_server, pki, sqlite_url):
    tenant = new_tenant(sqlite_url)
    token = tenant.tokens["agent"]
    target = f"localhost:{mtls_server.port}"
    with Ledger(
        target,
        token,
        root_certificates=pki.path("ca.pem"),
        client_certificate=Path(pki.path("client.pem")),
        client_key=pki.path("client-key.pem"),
    ) as by_path:
        assert by_path.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    with Ledger(
        target,
        token,
        root_certificates=pki.read("ca.pem"),
        client_certificate=pki.read("client.pem"),
        client_key=pki.read("client-key.pem"),
    ) as by_bytes:
        assert by_bytes.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    retry_once = RetryPolicy(attempts_max=1)
    no_client_certificate = Ledger(
        target, token, root_certificates=pki.path("ca.pem"), retry=retry_once, timeout_seconds=5
    )
    with no_client_certificate, pytest.raises(Unavailable):
        no_client_certificate.runs.CreateRun(runs_pb2.CreateRunRequest())
    plaintext = Ledger(target, token, retry=retry_once, timeout_seconds=5)
    with plaintext, pytest.raises(Unavailable):
        plaintext.runs.CreateRun(runs_pb2.CreateRunRequest())
    with pytest.raises(ValueError, match="come together"):
        Ledger(target, token, client_certificate=pki.path("client.pem"))


async def test_async_tls(mtls_server, pki, sqlite_url):
    tenant = new_tenant(sqlite_url)
    aio = AsyncLedger(
        f"localhost:{mtls_server.port}",
        tenant.tokens["agent"],
        root_certificates=pki.path("ca.pem"),
        client_certificate=pki.path("client.pem"),
        client_key=pki.path("client-key.pem"),
    )
    try:
        assert (await aio.runs.CreateRun(runs_pb2.CreateRunRequest())).run_id
    finally:
        await aio.close()
