"""SIGHUP never ends the server: with a remote OPA (``--opa-url``) it keeps serving and reads
the policy revision from OPA again; alone and under a supervisor with two workers."""

from __future__ import annotations

import signal
import time

import pytest
from grpc_health.v1 import health_pb2
from opa_standin import OpaStandIn

from effect_ledger.policy.engine import default_policy_dir
from support import ServerProcess, authorize_request, contract, new_run, new_tenant, outcome_name

pytestmark = pytest.mark.postgres

LOG_WAIT_SECONDS = 5.0


@pytest.fixture(scope="module")
def standin():
    opa = OpaStandIn(default_policy_dir()).start()
    yield opa
    opa.stop()


def wait_for_log(server: ServerProcess, text: str, count: int) -> bool:
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while time.monotonic() < deadline:
        if server.log_path.read_text(errors="replace").count(text) >= count:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_sighup_with_remote_opa_keeps_serving(pg_url, standin, workers):
    server = ServerProcess(pg_url, ["--opa-url", standin.url], workers=workers).start()
    try:
        tenant = new_tenant(pg_url)
        tenant.client(server, "admin").tools.PutToolContract(contract("email.send"))
        agent = tenant.client(server, "agent")
        run_id = new_run(agent)
        first = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-before"))
        assert outcome_name(first) == "ALLOW"
        revision_reads = standin.count("GET policies")

        for round_number in (1, 2):  # one at a time: signals sent together may arrive as one
            server.process.send_signal(signal.SIGHUP)
            logged = wait_for_log(server, "the policy lives in the OPA server", round_number * workers)
            assert logged, server.log()

        assert server.process.poll() is None, server.log()
        assert server.health() == health_pb2.HealthCheckResponse.SERVING
        # Every worker is still there: each answers on its own connections.
        assert server.log().count("exited with") == 0
        after = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-after"))
        assert outcome_name(after) == "ALLOW"
        assert after.policy_revision == first.policy_revision
        # The cached revision was dropped: the worker that answered read it from OPA again.
        assert standin.count("GET policies") > revision_reads
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log()
