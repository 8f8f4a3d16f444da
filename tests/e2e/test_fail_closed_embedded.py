"""The embedded engine fails closed: a policy that gives no valid decision never allows, and a
policy that allows everything still cannot authorize a tool without a live contract."""

from __future__ import annotations

import grpc
import pytest

from effect_ledger import errors
from effect_ledger.policy.embedded import load_engine
from effectledger.v1 import common_pb2, gate_pb2, tools_pb2
from support import ServerProcess, authorize_request, contract, new_run, new_tenant, outcome_name

pytestmark = pytest.mark.postgres

HEADER = "package effectledger.gate\n\nimport rego.v1\n\n"

# Policies whose data.effectledger.gate.decision is not a valid decision.
BROKEN_POLICIES = {
    "no-decision-rule": HEADER + 'deny contains "nothing" if { false }\n\nsomething_else := true\n',
    "decision-undefined": HEADER + 'decision := {"outcome": "ALLOW"} if { input.no_such_fact == 42 }\n',
    "decision-not-an-object": HEADER + 'decision := "ALLOW"\n',
    "allow-with-bad-reasons": HEADER + 'decision := {"outcome": "ALLOW", "reasons": "fine"}\n',
}
ALLOW_EVERYTHING = HEADER + 'decision := {"outcome": "ALLOW"}\n'


def policy_dir(tmp_path_factory, name: str, text: str):
    folder = tmp_path_factory.mktemp(f"policy-{name}")
    (folder / "effectledger").mkdir()
    (folder / "effectledger" / "gate.rego").write_text(text)
    # A test file next to it must not be loaded as policy.
    (folder / "effectledger" / "gate_test.rego").write_text(HEADER + 'decision := {"outcome": "ALLOW"}\n')
    return folder


@pytest.fixture(scope="module", params=sorted(BROKEN_POLICIES))
def broken_server(request, pg_url, tmp_path_factory):
    folder = policy_dir(tmp_path_factory, request.param, BROKEN_POLICIES[request.param])
    server = ServerProcess(pg_url, ["--policy-dir", str(folder)]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def allow_all(pg_url, tmp_path_factory):
    folder = policy_dir(tmp_path_factory, "allow-all", ALLOW_EVERYTHING)
    server = ServerProcess(pg_url, ["--policy-dir", str(folder)]).start()
    yield server, load_engine(folder)[1]
    server.stop()


def test_a_policy_without_a_valid_decision_never_allows(broken_server, pg_url):
    tenant = new_tenant(pg_url)
    admin, agent = tenant.client(broken_server, "admin"), tenant.client(broken_server, "agent")
    admin.tools.PutToolContract(contract("email.send"))
    run_id = new_run(agent)
    for n in range(5):
        with pytest.raises(errors.LedgerError) as raised:
            agent.gate.AuthorizeEffect(authorize_request(run_id, f"k-{n}"))
        assert raised.value.grpc_code == grpc.StatusCode.UNAVAILABLE
        assert raised.value.reason == "POLICY_UNDEFINED", raised.value
    assert list(agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects) == []


def test_allow_everything_cannot_allow_an_unknown_or_retired_tool(allow_all, pg_url):
    server, revision = allow_all
    tenant = new_tenant(pg_url)
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    admin.tools.PutToolContract(contract("email.send"))
    # The packaged policy would ask for approval here; this one allows, so it is the one in force.
    admin.tools.PutToolContract(
        contract("wire.transfer", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False)
    )
    admin.tools.PutToolContract(contract("old.tool"))
    admin.tools.RetireTool(tools_pb2.RetireToolRequest(tool="old.tool", reason="replaced"))
    run_id = new_run(agent)

    live = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-live"))
    irreversible = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-wire", tool="wire.transfer"))
    assert outcome_name(live) == "ALLOW" and outcome_name(irreversible) == "ALLOW"
    assert live.policy_revision == revision

    for key, tool, code in (("k-unknown", "no.such.tool", "TOOL_UNKNOWN"), ("k-retired", "old.tool", "TOOL_RETIRED")):
        response = agent.gate.AuthorizeEffect(authorize_request(run_id, key, tool=tool))
        assert outcome_name(response) == "DENY", (tool, response)
        assert code in [r.code for r in response.reasons]
        assert not response.attempt_id and not response.effect_id
        decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=response.decision_id))
        assert outcome_name(decision) == "DENY" and decision.engine == "embedded-regorus"
        assert decision.policy_revision == revision and not decision.attempt_id

    open_effects = agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
    assert {e.effect_id for e in open_effects} == {live.effect_id, irreversible.effect_id}
