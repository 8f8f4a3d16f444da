"""The gate fails closed when PostgreSQL refuses connections, and recovers by itself; each
refused call is logged with its cause, which the client is never told."""

from __future__ import annotations

import json
import time
import uuid

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2

from effect_ledger import errors
from effectledger.v1 import gate_pb2, gate_pb2_grpc
from support import (
    ServerProcess,
    allow_connections,
    authorize_request,
    contract,
    create_pg_database,
    drop_pg_database,
    migrate,
    new_run,
    new_tenant,
    outcome_name,
    psycopg_url,
)

pytestmark = pytest.mark.postgres

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_DEADLINE_SECONDS = 8.0
LOG_WAIT_SECONDS = 10.0
AUTHORIZE = "effectledger.v1.Gate/AuthorizeEffect"
TRACED_KEY = "k-outage-traced"


def health_or_none(server: ServerProcess):
    try:
        return server.health(timeout=1.0)
    except grpc.RpcError:
        return None


def wait_health(server: ServerProcess, wanted: int, timeout: float) -> float:
    """Poll until the health check answers ``wanted``; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if health_or_none(server) == wanted:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"health did not turn {wanted} within {timeout} s:\n{server.log()}")


def json_lines(server: ServerProcess) -> list[dict]:
    """The server's log lines (one JSON object each with --log-format json)."""
    lines = []
    for text in server.log_path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            raise AssertionError(f"not a JSON line in the server's log: {text!r}") from None
    return lines


def wait_for_log_line(server: ServerProcess, request_id: str) -> dict:
    """The ``call failed`` line of the call with ``request_id``."""
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while True:
        for line in json_lines(server):
            if line.get("event") == "call failed" and line.get("request_id") == request_id:
                return line
        assert time.monotonic() < deadline, f"no 'call failed' line for {request_id}:\n{server.log()}"
        time.sleep(0.05)


def refused_with_request_id(server: ServerProcess, agent_token: str, run_id: str) -> tuple[str, str]:
    """One AuthorizeEffect with an ``x-request-id``, refused: (its request id, everything the
    client was told: details and trailing metadata)."""
    request_id = f"outage-{uuid.uuid4().hex[:8]}"
    metadata = [("authorization", f"Bearer {agent_token}"), ("x-request-id", request_id)]
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as refused:
        gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
            authorize_request(run_id, TRACED_KEY), metadata=metadata, timeout=15
        )
    error = refused.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(error.trailing_metadata() or ())
    assert trailers["x-request-id"] == request_id
    return request_id, f"{error.details()} {trailers!r}"


@pytest.fixture
def lonely_database():
    url = create_pg_database("el_outage")
    migrate(url)
    yield url
    allow_connections(url.rsplit("/", 1)[1], True)
    drop_pg_database(url)


def test_authorize_fails_closed_while_the_database_refuses_then_recovers(lonely_database):
    name = lonely_database.rsplit("/", 1)[1]
    tenant = new_tenant(lonely_database)
    server = ServerProcess(lonely_database, ["--log-format", "json"]).start()
    try:
        admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
        admin.tools.PutToolContract(contract("email.send"))
        run_id = new_run(agent)
        before = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-before"))
        assert outcome_name(before) == "ALLOW"
        assert server.health() == SERVING

        allow_connections(name, False)
        refused_keys, answered, told = [], [], []
        for n in range(10):
            key = f"k-outage-{n}"
            refused_keys.append(key)
            try:
                response = agent.gate.AuthorizeEffect(authorize_request(run_id, key), timeout=15)
            except errors.LedgerError as error:
                assert error.grpc_code == grpc.StatusCode.UNAVAILABLE, error
                assert isinstance(error, errors.StorageUnavailable) and error.reason == "STORAGE_UNAVAILABLE", error
                told.append(f"{error.message} {error.metadata!r}")
            else:
                answered.append((key, outcome_name(response)))
        assert sum(outcome == "ALLOW" for _, outcome in answered) == 0
        assert answered == []
        # Reads fail closed too, with the same reason (no INTERNAL).
        with pytest.raises(errors.StorageUnavailable):
            agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=before.effect_id))
        wait_health(server, NOT_SERVING, HEALTH_DEADLINE_SECONDS)
        request_id, raw_told = refused_with_request_id(server, agent_token=tenant.tokens["agent"], run_id=run_id)
        told.append(raw_told)
        refused_keys.append(TRACED_KEY)

        # The log says why, under the call's request id; the client heard none of it.
        line = wait_for_log_line(server, request_id)
        assert (line["level"], line["method"], line["reason"]) == ("warning", AUTHORIZE, "STORAGE_UNAVAILABLE"), line
        cause = line["cause"]
        assert cause, line
        assert name in cause, cause  # the database that refused, named
        everything_told = "\n".join(told)
        assert cause not in everything_told and name not in everything_told
        failures = [
            logged
            for logged in json_lines(server)
            if logged.get("event") == "call failed" and logged.get("reason") == "STORAGE_UNAVAILABLE"
        ]
        assert len(failures) >= len(refused_keys) + 1 and all(logged["cause"] for logged in failures)

        allow_connections(name, True)
        wait_health(server, SERVING, HEALTH_DEADLINE_SECONDS)
        assert server.process.poll() is None  # recovered by itself, same process
        after = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-after"))
        assert outcome_name(after) == "ALLOW"
        # Nothing was written during the outage: no effect or decision for any refused key, and
        # a refused key is still free.
        with psycopg.connect(psycopg_url(lonely_database)) as connection:
            for table in ("effects", "decisions"):
                count = connection.execute(
                    f"SELECT count(*) FROM {table} WHERE tenant_id = %s AND idempotency_key = ANY(%s)",
                    (tenant.name, refused_keys),
                ).fetchone()[0]
                assert count == 0, table
        again = agent.gate.AuthorizeEffect(authorize_request(run_id, refused_keys[0]))
        assert outcome_name(again) == "ALLOW" and again.attempt_number == 1
        open_ids = {
            e.effect_id for e in agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
        }
        assert open_ids == {before.effect_id, after.effect_id, again.effect_id}
    finally:
        server.stop()
