"""deploy/healthcheck.py, the probes' check, against a real grpc.health.v1 server: readiness
(SERVING only) and liveness (``--any-status``: any answer, NOT_SERVING included)."""

from __future__ import annotations

import importlib.util
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

HEALTHCHECK = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"


@pytest.fixture
def check(monkeypatch):
    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("EFFECT_LEDGER_TLS_CERT", raising=False)  # plaintext, like the server here
    return module


@pytest.fixture
def server():
    servicer = health.HealthServicer()
    running = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, running)
    port = running.add_insecure_port("127.0.0.1:0")
    running.start()
    yield servicer, f"127.0.0.1:{port}", running
    running.stop(None)


@pytest.mark.parametrize(
    ("status", "ready", "alive"),
    [
        (health_pb2.HealthCheckResponse.SERVING, 0, 0),
        (health_pb2.HealthCheckResponse.NOT_SERVING, 1, 0),
    ],
    ids=["serving", "not-serving"],
)
def test_ready_only_when_serving_alive_whenever_it_answers(check, server, status, ready, alive):
    servicer, target, _ = server
    servicer.set("", status)
    check.TARGET = target
    assert check.main([]) == ready
    assert check.main(["--any-status"]) == alive


def test_not_alive_when_nothing_answers(check, server):
    _, target, running = server
    running.stop(None).wait()
    check.TARGET = target
    assert check.main(["--any-status"]) == 1
