"""Checkpoints: seal, register, check, resume after a crash with another model, fork."""

from __future__ import annotations

import json

import pytest

from effectledger.v1 import checkpoints_pb2, gate_pb2, runs_pb2
from support import (
    ServerProcess,
    authorize_request,
    checkpoints_stub,
    contract,
    new_run,
    outcome_name,
    raises_error,
    stage_name,
    unknown,
)


def facts(**overrides) -> checkpoints_pb2.CompatibilityFacts:
    values = {
        "runtime": "agent-runtime/3",
        "contract_schema": "tools/v2",
        "code_version": "1.4.0",
        "checkpoint_format": 2,
    }
    values.update(overrides)
    return checkpoints_pb2.CompatibilityFacts(**values)


@pytest.fixture
def own_server(database_url):
    """A server of this test's own: the test kills it."""
    running = ServerProcess(database_url).start()
    yield running
    running.kill()


def test_an_unknown_effect_survives_a_crash_and_a_model_switch(own_server, tenant):
    admin, agent = tenant.client(own_server, "admin"), tenant.client(own_server, "agent")
    tenant.add("operator", "operator")
    operator = tenant.client(own_server, "operator")
    checkpoints = checkpoints_stub(own_server, tenant.tokens["agent"])
    admin.tools.PutToolContract(contract())
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest(provider="provider-a", model="model-a")).run_id
    sent = agent.gate.AuthorizeEffect(authorize_request(run_id, "send-1"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=sent.attempt_id))
    agent.gate.RecordOutcome(unknown(sent.attempt_id, "connection reset after sending"))
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision

    sealed = checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id, expected_revision=revision, state_json=b'{"plan":["reply to bob"],"step":2}', facts=facts()
        )
    )
    assert checkpoints_pb2.CheckpointStatus.Name(sealed.status) == "SEALED" and sealed.revision == revision
    ledger = json.loads(sealed.ledger_json)
    assert [e["effect_id"] for e in ledger["effects"]["open"]] == [sent.effect_id]
    assert ledger["effects"]["open"][0]["stage"] == "UNKNOWN"
    assert ledger["policy"]["revision"] == sent.policy_revision
    manifest = json.loads(sealed.manifest_json)
    assert set(manifest["sections"]) == {"effects", "approvals", "budgets", "tools", "policy", "schedules"}
    assert ledger["schedules"] == []  # none open
    events = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
    assert events[-1].type == "checkpoint.sealed" and events[-1].revision == revision + 1

    registered = checkpoints.RegisterCheckpoint(
        checkpoints_pb2.RegisterCheckpointRequest(
            checkpoint_id=sealed.checkpoint_id, facts=facts(recorded_effects=[sent.effect_id])
        )
    )
    assert checkpoints_pb2.CheckpointStatus.Name(registered.status) == "REGISTERED"

    own_server.kill()
    own_server.start()
    agent = tenant.client(own_server, "agent")
    checkpoints = checkpoints_stub(own_server, tenant.tokens["agent"])

    forgetful = checkpoints.CheckResumeCompatibility(
        checkpoints_pb2.CheckResumeCompatibilityRequest(
            checkpoint_id=sealed.checkpoint_id, current=facts(code_version="1.5.0")
        )
    )
    assert checkpoints_pb2.Verdict.Name(forgetful.verdict) == "INCOMPATIBLE"
    assert {f.fact for f in forgetful.facts} == {"code_version", f"effect:{sent.effect_id}"}

    current = facts(recorded_effects=[sent.effect_id])
    resumed = checkpoints.ResumeRun(
        checkpoints_pb2.ResumeRunRequest(
            checkpoint_id=sealed.checkpoint_id,
            configuration=checkpoints_pb2.Configuration(provider="provider-b", model="model-b", adapter="responses"),
            reason="provider session lost",
            current=current,
        )
    )
    assert [(e.effect_id, e.stage) for e in resumed.open_effects] == [(sent.effect_id, "UNKNOWN")]
    assert resumed.segment == 2
    transition = agent.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events[-1]
    assert transition.type == "run.configuration_transition"
    payload = json.loads(transition.payload_json)
    assert payload["old"]["model"] == "model-a" and payload["new"]["model"] == "model-b"
    assert payload["checkpoint_id"] == sealed.checkpoint_id

    # The resuming client "knows" nothing happened; the ledger knows better.
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "send-1"))
    assert outcome_name(again) == "RECONCILE_REQUIRED" and again.effect_id == sent.effect_id
    fresh = agent.gate.AuthorizeEffect(authorize_request(run_id, "send-2", target="mailto:carol@example.com"))
    assert outcome_name(fresh) == "DENY" and [r.code for r in fresh.reasons][0] == "RECONCILE_AFTER_RESUME"
    operator.gate.ReconcileEffect(
        gate_pb2.ReconcileEffectRequest(
            effect_id=sent.effect_id,
            not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="provider has no message with our key"),
        )
    )
    after = agent.gate.AuthorizeEffect(authorize_request(run_id, "send-2", target="mailto:carol@example.com"))
    assert outcome_name(after) == "ALLOW"


def test_seal_refuses_a_run_that_moved_and_live_continuations(server, tenant):
    agent = tenant.client(server, "agent")
    checkpoints = checkpoints_stub(server, tenant.tokens["agent"])
    run_id = new_run(agent)
    with raises_error("FAILED_PRECONDITION", "REVISION_MOVED"):
        checkpoints.SealCheckpoint(
            checkpoints_pb2.SealCheckpointRequest(run_id=run_id, expected_revision=0, state_json=b"{}")
        )
    assert raises_error.last.metadata["current_revision"] == "1"
    with raises_error("FAILED_PRECONDITION", "LIVE_CONTINUATION_NOT_STORABLE"):
        checkpoints.StoreLiveContinuation(checkpoints_pb2.LiveContinuation(value=b"socket"))
    with raises_error("FAILED_PRECONDITION", "LIVE_CONTINUATION_NOT_STORABLE"):
        checkpoints.SealCheckpoint(
            checkpoints_pb2.SealCheckpointRequest(
                run_id=run_id, expected_revision=1, state_json=b'{"lifetime":"live_continuation"}'
            )
        )


def test_export_import_round_trip_and_fork(server, tenant):
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    checkpoints = checkpoints_stub(server, tenant.tokens["agent"])
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    sent = agent.gate.AuthorizeEffect(authorize_request(run_id, "k1"))
    agent.gate.RecordOutcome(unknown(sent.attempt_id))
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id, expected_revision=revision, state_json=b'{"x":1}', facts=facts()
        )
    )
    chunks = list(
        checkpoints.ExportCheckpoint(checkpoints_pb2.ExportCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    )
    archive = b"".join(c.data for c in chunks)
    import io
    import tarfile

    names = tarfile.open(fileobj=io.BytesIO(archive)).getnames()
    assert set(names) == {
        "manifest.json",
        "state.json",
        "artifacts.json",
        "README.md",
        "ledger/effects.json",
        "ledger/approvals.json",
        "ledger/budgets.json",
        "ledger/tools.json",
        "ledger/policy.json",
        "ledger/schedules.json",
        "manifest.sig",
    }  # signed by the deployment's own key
    readme = tarfile.open(fileobj=io.BytesIO(archive)).extractfile("README.md").read().decode()
    assert sent.effect_id in readme and "may have happened" in readme
    imported = checkpoints.ImportCheckpoint(iter([checkpoints_pb2.ArchiveChunk(data=c.data) for c in chunks]))
    assert imported.run_id == run_id and imported.imported_from_digest
    assert json.loads(imported.ledger_json) == json.loads(sealed.ledger_json)

    checkpoints.RegisterCheckpoint(checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    fork = checkpoints.ForkRun(
        checkpoints_pb2.ForkRunRequest(
            checkpoint_id=sealed.checkpoint_id, world=checkpoints_pb2.SIMULATED, difference="model B"
        )
    )
    child = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=fork.run_id))
    assert child.parent_run_id == run_id and child.world == "SIMULATED"
    live = agent.gate.AuthorizeEffect(authorize_request(fork.run_id, "child-1", target="mailto:zed@example.com"))
    assert outcome_name(live) == "DENY" and "LIVE_TOOL_IN_SIMULATED_WORLD" in [r.code for r in live.reasons]
    parent_effect = agent.gate.AuthorizeEffect(authorize_request(fork.run_id, "child-2"))
    assert outcome_name(parent_effect) == "RECONCILE_REQUIRED" and parent_effect.effect_id == sent.effect_id
    assert stage_name(parent_effect.effect_stage) == "UNKNOWN"
