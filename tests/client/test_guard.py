"""``Ledger.guard`` and ``Ledger.guarded`` against a real server, on PostgreSQL and on SQLite:
every answer of the gate, every way a body ends, the lease renewed while the body runs."""

from __future__ import annotations

import json
import threading
import time

import pytest

from effect_ledger_client import (
    AlreadySucceeded,
    ApprovalDenied,
    ApprovalTimeout,
    Denied,
    Receipt,
    ReconcileRequired,
    Rejected,
)
from effect_ledger_client.proto import approvals_pb2, budgets_pb2, common_pb2, gate_pb2, runs_pb2

from .conftest import IRREVERSIBLE_TOOL, register, register_irreversible

ARGUMENTS = {"to": "bob@example.com", "subject": "hello"}


def effect_of(ledger, effect_id: str) -> gate_pb2.Effect:
    return ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))


def stage(effect: gate_pb2.Effect) -> str:
    return common_pb2.Stage.Name(effect.stage)


def attempt_stage(effect: gate_pb2.Effect, number: int = 0) -> str:
    return common_pb2.Stage.Name(effect.attempts[number].stage)


# --- ALLOW -------------------------------------------------------------------------------------


def test_allow_runs_the_body_dispatched_and_records_its_receipt(ledger, admin_ledger, run_id):
    register(admin_ledger)
    admin_ledger.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id, dimension="emails", limit=10)
    )
    seen = {}
    with ledger.guard(
        run_id, "email.send", ARGUMENTS, key="welcome-42", target="mailto:bob@example.com", estimate={"emails": 1}
    ) as effect:
        during = effect_of(ledger, effect.effect_id)
        seen["stage"], seen["key"] = attempt_stage(during), during.attempts[0].provider_idempotency_key
        receipt = effect.succeeded("msg-1", detail={"status": "queued"}, usage={"emails": 1})
    # The attempt started DISPATCHED: a crash in the body would have left it UNKNOWN.
    assert seen == {"stage": "DISPATCHED", "key": effect.provider_key} and effect.provider_key
    stored = effect_of(ledger, effect.effect_id)
    assert stage(stored) == "SUCCEEDED" and stored.idempotency_key == "welcome-42"
    assert stored.target == "mailto:bob@example.com" and json.loads(stored.arguments_json) == ARGUMENTS
    assert stored.receipt.provider_reference == "msg-1" and json.loads(stored.receipt.detail_json) == {
        "status": "queued"
    }
    assert receipt == Receipt.from_proto(stored.receipt) and receipt.digest and receipt.detail == {"status": "queued"}
    assert effect.reported
    (budget,) = ledger.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id)).budgets
    assert (budget.posted, budget.pending) == (1, 0)


def test_the_target_defaults_to_the_tool_name(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="no-target") as effect:
        effect.succeeded("msg-1")
    assert effect_of(ledger, effect.effect_id).target == "email.send"


# --- DENY, RECONCILE_REQUIRED, DUPLICATE ---------------------------------------------------------


def test_deny_raises_denied_with_reasons_and_decision_and_runs_nothing(ledger, run_id):
    body_ran = False
    with pytest.raises(Denied) as denied, ledger.guard(run_id, "never.registered", ARGUMENTS, key="k1"):
        body_ran = True
    assert not body_ran and [reason.code for reason in denied.value.reasons] == ["TOOL_UNKNOWN"]
    decision = ledger.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=denied.value.decision_id))
    assert common_pb2.Outcome.Name(decision.outcome) == "DENY" and decision.idempotency_key == "k1"


def test_an_exception_in_the_body_leaves_the_effect_unknown_then_reconcile_required(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with pytest.raises(TimeoutError), ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        raise TimeoutError("the provider did not answer")
    stored = effect_of(ledger, effect.effect_id)
    assert stage(stored) == "UNKNOWN" and attempt_stage(stored) == "UNKNOWN"
    assert "TimeoutError" in stored.attempts[0].outcome_reason

    body_ran = False
    with pytest.raises(ReconcileRequired) as required, ledger.guard(run_id, "email.send", ARGUMENTS, key="k1"):
        body_ran = True
    assert not body_ran
    assert (required.value.effect_id, required.value.stage) == (effect.effect_id, "UNKNOWN")
    assert required.value.decision_id


def test_a_body_that_reports_nothing_leaves_the_effect_unknown(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        pass
    assert stage(effect_of(ledger, effect.effect_id)) == "UNKNOWN"


def test_rejected_is_recorded_failed_and_re_raised(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with (
        pytest.raises(Rejected, match="mailbox does not exist"),
        ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect,
    ):
        raise Rejected("mailbox does not exist")
    stored = effect_of(ledger, effect.effect_id)
    assert stage(stored) == "FAILED" and stored.attempts[0].outcome_reason == "mailbox does not exist"
    assert stored.attempts[0].failure_evidence == gate_pb2.PROVIDER_REJECTED


def test_effect_failed_is_recorded_failed_without_an_exception(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        effect.failed("quota exceeded at the provider")
    assert stage(effect_of(ledger, effect.effect_id)) == "FAILED"


def test_an_exception_after_reporting_success_keeps_the_success(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with pytest.raises(KeyError), ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        effect.succeeded("msg-1")
        raise KeyError("after the report")
    assert stage(effect_of(ledger, effect.effect_id)) == "SUCCEEDED"


def test_duplicate_in_the_with_form_raises_already_succeeded_before_the_body(ledger, admin_ledger, run_id):
    register(admin_ledger)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="k1") as effect:
        first = effect.succeeded("msg-1", detail={"n": 1})
    runs = []
    with pytest.raises(AlreadySucceeded) as done, ledger.guard(run_id, "email.send", ARGUMENTS, key="k1"):
        runs.append("body")
    assert runs == [] and done.value.receipt == first and done.value.effect_id == effect.effect_id


def test_duplicate_in_the_decorator_returns_the_stored_receipt_without_calling(ledger, admin_ledger, run_id):
    register(admin_ledger)
    calls = []

    @ledger.guarded(
        "email.send",
        run_id=run_id,
        key=lambda call: f"welcome/{call['to']}",
        target=lambda call: f"mailto:{call['to']}",
    )
    def send_welcome(to: str, subject: str = "Welcome", *, effect):
        calls.append((to, subject, effect.provider_key))
        return effect.succeeded(f"msg-{len(calls)}")

    first = send_welcome("bob@example.com")
    again = send_welcome("bob@example.com")
    other = send_welcome("carol@example.com", subject="Hi")
    assert [to for to, _, _ in calls] == ["bob@example.com", "carol@example.com"]
    assert again == first and first.reference == "msg-1" and other.reference == "msg-2"
    effects = ledger.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
    assert list(effects) == []


def test_the_decorator_sends_the_call_arguments_and_needs_an_effect_parameter(ledger, admin_ledger, run_id):
    register(admin_ledger)
    seen = {}

    @ledger.guarded(
        "email.send", run_id=lambda call: call["run"], key="fixed-key", arguments=lambda call: {"to": call["to"]}
    )
    def send(run, to, *, effect):
        seen["effect_id"] = effect.effect_id
        effect.succeeded("msg-1")
        return "done"

    assert send(run_id, "bob@example.com") == "done"
    stored = effect_of(ledger, seen["effect_id"])
    assert json.loads(stored.arguments_json) == {"to": "bob@example.com"} and stored.idempotency_key == "fixed-key"
    with pytest.raises(TypeError, match="effect"):
        ledger.guarded("email.send", run_id=run_id, key="k")(lambda to: None)


def test_the_sync_decorator_refuses_async_functions():
    """Ledger.guarded on an ``async def`` would report UNKNOWN before the coroutine even ran."""
    from effect_ledger_client import Ledger

    with Ledger("127.0.0.1:1", "token") as nowhere:
        decorate = nowhere.guarded("email.send", run_id="run_x", key="k")

        async def send(to, *, effect):
            return None

        async def sends(to, *, effect):
            yield None

        with pytest.raises(TypeError, match="AsyncLedger"):
            decorate(send)
        with pytest.raises(TypeError, match="AsyncLedger"):
            decorate(sends)
        assert decorate(lambda to, *, effect: None)  # a plain function is decorated


def test_the_decorated_function_raising_leaves_unknown_and_propagates(ledger, admin_ledger, run_id):
    register(admin_ledger)

    @ledger.guarded("email.send", run_id=run_id, key=lambda call: call["key"])
    def send(key, *, effect):
        send.effect_id = effect.effect_id
        raise ConnectionResetError("reset after sending")

    with pytest.raises(ConnectionResetError):
        send("k1")
    assert stage(effect_of(ledger, send.effect_id)) == "UNKNOWN"
    with pytest.raises(ReconcileRequired):
        send("k1")


# --- REQUIRE_APPROVAL ----------------------------------------------------------------------------


def decide_when_pending(reviewer_ledger, run_id: str, approve: bool, found: list) -> threading.Thread:
    """A reviewer in another thread: waits for the run's pending request, then decides it."""

    def review():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pending = reviewer_ledger.approvals.ListApprovals(
                approvals_pb2.ListApprovalsRequest(run_id=run_id, state=approvals_pb2.PENDING)
            ).approvals
            if pending:
                found.append(pending[0].approval_id)
                time.sleep(0.5)  # let the guard start watching first
                reviewer_ledger.approvals.DecideApproval(
                    approvals_pb2.DecideApprovalRequest(
                        approval_id=pending[0].approval_id, approve=approve, comment="checked by hand"
                    )
                )
                return
            time.sleep(0.1)

    thread = threading.Thread(target=review, daemon=True)
    thread.start()
    return thread


def test_require_approval_waits_for_a_reviewer_then_runs_the_body(ledger, admin_ledger, reviewer_ledger, run_id):
    register_irreversible(admin_ledger)
    found: list[str] = []
    reviewer = decide_when_pending(reviewer_ledger, run_id, True, found)
    with ledger.guard(
        run_id, IRREVERSIBLE_TOOL, {"amount": 100}, key="wire-1", target="bank:acct-1", approval_timeout_seconds=60
    ) as effect:
        receipt = effect.succeeded("wire-ref-1")
    reviewer.join(5)
    assert found and effect.response.approval_id == found[0] and receipt.reference == "wire-ref-1"
    assert stage(effect_of(ledger, effect.effect_id)) == "SUCCEEDED"
    approval = ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=found[0]))
    assert approvals_pb2.ApprovalState.Name(approval.state) == "CONSUMED"


def test_a_denied_approval_raises_approval_denied(ledger, admin_ledger, reviewer_ledger, run_id):
    register_irreversible(admin_ledger)
    found: list[str] = []
    decide_when_pending(reviewer_ledger, run_id, False, found)
    body_ran = False
    with (
        pytest.raises(ApprovalDenied) as denied,
        ledger.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 100}, key="wire-1", approval_timeout_seconds=60),
    ):
        body_ran = True
    assert not body_ran and denied.value.approval_id == found[0]
    assert [reason.code for reason in denied.value.reasons] == ["APPROVAL_DENIED"]


def test_an_approval_not_decided_in_time_raises_approval_timeout(ledger, admin_ledger, run_id):
    register_irreversible(admin_ledger)
    started = time.monotonic()
    body_ran = False
    with (
        pytest.raises(ApprovalTimeout) as timeout,
        ledger.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 100}, key="wire-1", approval_timeout_seconds=1.5),
    ):
        body_ran = True
    waited = time.monotonic() - started
    assert not body_ran and 1.5 <= waited < 10
    approval = ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=timeout.value.approval_id))
    assert approvals_pb2.ApprovalState.Name(approval.state) == "PENDING"


# --- the lease -----------------------------------------------------------------------------------


def test_the_lease_is_renewed_while_a_body_outlives_it(ledger, admin_ledger, run_id):
    register(admin_ledger, lease_seconds=2)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="slow-1") as effect:
        first_lease_end = effect.lease_expires_at
        time.sleep(5)  # two and a half leases; the server's sweeper runs every 0.2 s
        during = effect_of(ledger, effect.effect_id)
        assert attempt_stage(during) == "DISPATCHED" and effect.lease_lost is None
        effect.succeeded("msg-slow")
    assert effect.lease_expires_at > first_lease_end
    assert stage(effect_of(ledger, effect.effect_id)) == "SUCCEEDED"
    # Renewals stop on exit: the renewer thread is gone.
    assert not any(t.name == f"effect-ledger-lease-{effect.attempt_id}" for t in threading.enumerate())


def test_without_renewal_the_same_body_loses_its_lease(ledger, admin_ledger, run_id, monkeypatch):
    """The control for the test above: with renewals off, the lease runs out mid-body, and the
    receipt then settles the effect through ReconcileEffect."""
    from effect_ledger_client import ledger as sync_module

    monkeypatch.setattr(sync_module.Effect, "_start_renewing", lambda self: None)
    register(admin_ledger, lease_seconds=2)
    with ledger.guard(run_id, "email.send", ARGUMENTS, key="slow-1") as effect:
        time.sleep(3)
        assert attempt_stage(effect_of(ledger, effect.effect_id)) == "UNKNOWN"
        receipt = effect.succeeded("msg-late")
    stored = effect_of(ledger, effect.effect_id)
    assert stage(stored) == "SUCCEEDED" and stored.reconciled_by == "agent" and receipt.reference == "msg-late"


def test_the_approval_wait_outlives_the_servers_stream_lifetime(sqlite_url):
    """WatchApprovals ends normally after --stream-lifetime-max-seconds; the guard watches again
    from its last sequence and still sees the decision that comes later."""
    from effect_ledger_client import Ledger
    from support import ServerProcess, new_tenant

    server = ServerProcess(sqlite_url, ["--stream-lifetime-max-seconds", "1"]).start()
    tenant = new_tenant(sqlite_url)
    try:
        with (
            Ledger(server.target, tenant.tokens["agent"]) as agent,
            Ledger(server.target, tenant.tokens["admin"]) as admin,
            Ledger(server.target, tenant.tokens["reviewer"]) as reviewer,
        ):
            register_irreversible(admin)
            run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
            found: list[str] = []
            waiting = threading.Event()

            def review_late():
                waiting.wait(30)
                time.sleep(3)  # three stream lifetimes
                decide_when_pending(reviewer, run_id, True, found).join(30)

            thread = threading.Thread(target=review_late, daemon=True)
            thread.start()
            waiting.set()
            started = time.monotonic()
            with agent.guard(run_id, IRREVERSIBLE_TOOL, {"amount": 1}, key="w1", approval_timeout_seconds=60) as effect:
                effect.succeeded("wire-1")
            assert time.monotonic() - started >= 3 and found
            assert effect.response.approval_id == found[0]
    finally:
        server.stop()
