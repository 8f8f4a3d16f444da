"""The gate with a remote OPA (``--opa-url``): real decisions, and fail-closed on every fault.

OPA itself is played by ``opa_standin.OpaStandIn``, which evaluates the repository's policy with
regorus in its normal mode and misbehaves on demand (see its docstring).
"""

from __future__ import annotations

import json
import time

import grpc
import psycopg
import pytest
from opa_standin import OpaStandIn

from effect_ledger import errors
from effect_ledger.policy.embedded import EmbeddedRegoEngine, load_engine
from effect_ledger.policy.engine import default_policy_dir
from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import (
    ServerProcess,
    authorize_request,
    contract,
    new_run,
    new_tenant,
    outcome_name,
    psycopg_url,
)

pytestmark = pytest.mark.postgres

OPA_TIMEOUT_SECONDS = 0.3
CALLS_PER_MODE = 10

# (mode, result served by "malformed", the ErrorInfo reason the gate must answer)
FAULTS = [
    ("stopped", None, "POLICY_UNAVAILABLE"),
    ("http500", None, "POLICY_UNAVAILABLE"),
    ("slow", None, "POLICY_UNAVAILABLE"),
    ("no_result", None, "POLICY_UNDEFINED"),
    ("malformed", {"outcome": "MAYBE"}, "POLICY_UNDEFINED"),
    ("malformed", "ALLOW", "POLICY_UNDEFINED"),
    ("malformed", {"outcome": "ALLOW", "reasons": "looks fine"}, "POLICY_UNDEFINED"),
    ("malformed", {"outcome": "DUPLICATE", "reasons": [{"code": "X", "message": "y"}]}, "POLICY_UNDEFINED"),
]


@pytest.fixture(scope="module")
def standin():
    opa = OpaStandIn(default_policy_dir(), slow_seconds=2.0).start()
    yield opa
    opa.stop()


@pytest.fixture(scope="module")
def opa_server(pg_url, standin):
    server = ServerProcess(
        pg_url,
        ["--opa-url", standin.url, "--opa-timeout-seconds", str(OPA_TIMEOUT_SECONDS)],
    ).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def normal_mode(standin):
    standin.set_mode("normal")
    yield
    standin.set_mode("normal")


def embedded_revision() -> str:
    return load_engine(default_policy_dir())[1]


def reason_codes(message) -> list[str]:
    return [r.code for r in message.reasons]


async def embedded_answer(input_json: bytes) -> tuple[str, list[str]]:
    decision = await EmbeddedRegoEngine(default_policy_dir()).evaluate(json.loads(input_json))
    return decision.outcome.value, [r.code for r in decision.reasons]


def rows_for_keys(pg_url: str, tenant_name: str, keys: list[str]) -> dict[str, int]:
    """How many effects and decisions the database holds for these idempotency keys."""
    with psycopg.connect(psycopg_url(pg_url)) as connection:
        return {
            table: connection.execute(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %s AND idempotency_key = ANY(%s)",
                (tenant_name, keys),
            ).fetchone()[0]
            for table in ("effects", "decisions")
        }


async def test_decisions_come_from_the_remote_policy(opa_server, standin, pg_url):
    tenant = new_tenant(pg_url)
    admin, agent = tenant.client(opa_server, "admin"), tenant.client(opa_server, "agent")
    admin.tools.PutToolContract(contract("email.send"))
    admin.tools.PutToolContract(
        contract("wire.transfer", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False)
    )
    run_id = new_run(agent)
    revision = embedded_revision()
    queries_before = standin.count("POST decision")

    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-allow"))
    unknown = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-unknown", tool="no.such.tool"))
    approval = agent.gate.AuthorizeEffect(authorize_request(run_id, "k-approval", tool="wire.transfer"))

    assert outcome_name(allowed) == "ALLOW" and allowed.attempt_id
    assert outcome_name(unknown) == "DENY" and "TOOL_UNKNOWN" in reason_codes(unknown) and not unknown.attempt_id
    # Only the policy knows this rule: the answer really came from evaluating it remotely.
    assert outcome_name(approval) == "REQUIRE_APPROVAL" and reason_codes(approval) == ["IRREVERSIBLE_TOOL"]
    # One evaluation per call, and one more for REQUIRE_APPROVAL on PostgreSQL: its fast path
    # evaluates, finds an approval request to file, and hands the call (nothing written) to the
    # general path, which reads the facts again and evaluates them (docs/decisions.md).
    assert standin.count("POST decision") - queries_before == 4

    for response in (allowed, unknown, approval):
        # Same policy files, same names: the remote revision is the embedded engine's revision.
        assert response.policy_revision == revision
        decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=response.decision_id))
        assert decision.engine == "opa-remote"
        assert decision.policy_revision == revision
        assert decision.outcome == response.outcome
        # The stand-in answers what the embedded engine answers for the recorded input.
        outcome, codes = await embedded_answer(decision.input_json)
        assert (outcome, codes) == (outcome_name(decision), reason_codes(decision))


def test_every_fault_fails_closed_and_writes_nothing(opa_server, standin, pg_url):
    tenant = new_tenant(pg_url)
    admin, agent = tenant.client(opa_server, "admin"), tenant.client(opa_server, "agent")
    admin.tools.PutToolContract(contract("email.send"))
    run_id = new_run(agent)  # only faulty calls go here
    probe_run = new_run(agent)  # the recovery checks go here
    pid = opa_server.process.pid
    run_revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    # The same request is allowed while the policy works.
    assert outcome_name(agent.gate.AuthorizeEffect(authorize_request(probe_run, "probe-0"))) == "ALLOW"

    allows, failures, answered, keys_by_mode = 0, 0, [], []
    for index, (mode, result, expected_reason) in enumerate(FAULTS):
        standin.set_mode(mode, **({"result": result} if result is not None else {}))
        requests_before, queries_before = standin.count(), standin.count("POST decision")
        keys = [f"fault-{index}-{mode}-{n}" for n in range(CALLS_PER_MODE)]
        keys_by_mode.append(keys)
        for key in keys:
            started = time.monotonic()
            try:
                response = agent.gate.AuthorizeEffect(authorize_request(run_id, key))
            except errors.LedgerError as error:
                failures += 1
                assert error.grpc_code == grpc.StatusCode.UNAVAILABLE, (mode, key, error)
                assert isinstance(error, errors.PolicyUnavailable), (mode, key, error)
                assert error.reason == expected_reason, (mode, result, key, error)
                if expected_reason == "POLICY_UNAVAILABLE":
                    assert error.metadata.get("engine") == "opa-remote", error.metadata
                if mode == "slow":
                    # It waited for OPA up to the timeout, and no longer.
                    assert OPA_TIMEOUT_SECONDS * 0.9 <= time.monotonic() - started < 2.0
            else:
                allows += outcome_name(response) == "ALLOW"
                answered.append((mode, result, key, outcome_name(response)))
        if mode == "stopped":
            assert standin.count() == requests_before  # nothing was listening
        else:
            assert standin.count() > requests_before  # each fault was really met
        if mode in ("no_result", "malformed"):
            # Every call reached the decision query; it was the answer that was refused.
            assert standin.count("POST decision") - queries_before == CALLS_PER_MODE
        # The fault is transient: the same server allows again as soon as the policy answers.
        standin.set_mode("normal")
        probe = agent.gate.AuthorizeEffect(authorize_request(probe_run, f"probe-{index + 1}"))
        assert outcome_name(probe) == "ALLOW", mode

    assert allows == 0, answered
    assert answered == []
    assert failures == len(FAULTS) * CALLS_PER_MODE

    # Nothing was written for any refused call.
    every_key = [key for keys in keys_by_mode for key in keys]
    assert rows_for_keys(pg_url, tenant.name, every_key) == {"effects": 0, "decisions": 0}
    assert list(agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects) == []
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision == run_revision
    events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
    assert [e.type for e in events] == ["run.created"]

    # Recovered, without restarting effect-ledger: each refused key is still free, so it binds
    # a new effect with a first attempt.
    assert opa_server.process.pid == pid and opa_server.process.poll() is None
    effect_ids = set()
    for keys in keys_by_mode:
        again = agent.gate.AuthorizeEffect(authorize_request(run_id, keys[0]))
        assert outcome_name(again) == "ALLOW" and again.attempt_number == 1
        effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=again.effect_id))
        assert effect.idempotency_key == keys[0] and len(effect.attempts) == 1
        effect_ids.add(again.effect_id)
    assert len(effect_ids) == len(FAULTS)
    open_effects = agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
    assert {e.effect_id for e in open_effects} == effect_ids
    assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision == run_revision + len(FAULTS)


def test_a_call_without_a_deadline_gets_the_default_one_and_writes_nothing(pg_url, standin):
    """A client that sends no deadline still gets an answer: DEADLINE_EXCEEDED after the
    server's default, here shorter than a policy that hangs (nothing is written)."""
    import grpc

    from effectledger.v1 import gate_pb2_grpc, runs_pb2, runs_pb2_grpc, tools_pb2_grpc

    server = ServerProcess(
        pg_url,
        ["--opa-url", standin.url, "--opa-timeout-seconds", "5", "--default-deadline-seconds", "0.5"],
    ).start()
    try:
        tenant = new_tenant(pg_url)
        with grpc.insecure_channel(server.target) as channel:
            admin = (("authorization", f"Bearer {tenant.tokens['admin']}"),)
            agent = (("authorization", f"Bearer {tenant.tokens['agent']}"),)
            tools_pb2_grpc.ToolRegistryStub(channel).PutToolContract(contract(), metadata=admin)
            run = runs_pb2_grpc.RunsStub(channel).CreateRun(runs_pb2.CreateRunRequest(), metadata=agent)
            standin.set_mode("slow")
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
                    authorize_request(run.run_id, "no-deadline"), metadata=agent
                )
            elapsed = time.monotonic() - started
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert elapsed < 2.0, "answered by the server's default deadline, not the policy's timeout"
            standin.set_mode("normal")
            head = runs_pb2_grpc.RunsStub(channel).GetRun(runs_pb2.GetRunRequest(run_id=run.run_id), metadata=agent)
            assert head.revision == 1, "nothing was written"
    finally:
        server.stop()


def test_reconciliation_is_decided_by_the_remote_policy_and_fails_closed(opa_server, standin, pg_url):
    """ReconcileEffect asks OPA for data.effectledger.reconcile.decision; when OPA gives no
    answer the effect stays as it was."""
    from support import not_happened, raises_error, stage_name, unknown

    tenant = new_tenant(pg_url)
    tenant.add("operator", "operator")
    admin, agent = tenant.client(opa_server, "admin"), tenant.client(opa_server, "agent")
    operator = tenant.client(opa_server, "operator")
    admin.tools.PutToolContract(
        contract(
            "payment.manual",
            effect_class=common_pb2.COMPENSATABLE,
            provider_idempotency=False,
            allowed_recovery=(common_pb2.MANUAL_ONLY,),
        )
    )
    run_id = new_run(agent)
    effects = []
    for key in ("k-down", "k-up"):
        allowed = agent.gate.AuthorizeEffect(
            authorize_request(run_id, key, tool="payment.manual", target=f"bank:{key}")
        )
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id))
        agent.gate.RecordOutcome(unknown(allowed.attempt_id))
        effects.append(allowed.effect_id)

    standin.set_mode("no_result")
    with raises_error("UNAVAILABLE", "POLICY_UNDEFINED"):
        operator.gate.ReconcileEffect(not_happened(effects[0]))
    assert stage_name(agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effects[0])).stage) == "UNKNOWN"

    standin.set_mode("normal")
    settled = operator.gate.ReconcileEffect(not_happened(effects[1]))
    assert stage_name(settled.stage) == "FAILED"
    events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id, page_size=1000)).events
    (reconciled,) = [json.loads(e.payload_json) for e in events if e.type == "effect.reconciled"]
    decision = agent.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=reconciled["decision_id"]))
    assert decision.engine == "opa-remote" and outcome_name(decision) == "ALLOW"
