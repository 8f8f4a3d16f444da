"""The lease edge: one clock per judgment, read after the row it judges is locked.

A RecordDispatch sent just before its lease ends, which waits for the effect's lock (held here
by a second database connection from 0.25 s before the lease end until 0.15 s after), reaches
the lock after the lease ran out. Judged by a clock read before the lock it was accepted, with
a new lease computed from the stale time, while reads already showed the attempt UNKNOWN; a
reconciler acting on that read then settled it not_happened and the next AuthorizeEffect
allowed a second send. Now the dispatch is refused (LEASE_EXPIRED), the expiry is recorded,
reads that show UNKNOWN have recorded it, and only the attempt's owner may say "not happened"
before the grace after the lease end has passed. Over real gRPC, on PostgreSQL and on SQLite.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import UTC, datetime

import psycopg

from effect_ledger.storage.dialect import normalize_url
from effectledger.v1 import common_pb2, gate_pb2, runs_pb2
from support import (
    authorize_request,
    contract,
    new_run,
    not_happened,
    outcome_name,
    psycopg_url,
    raises_error,
    stage_name,
    succeeded,
)

LOCK_BEFORE_LEASE_END_SECONDS = 0.25
LOCK_AFTER_LEASE_END_SECONDS = 0.15
DISPATCH_BEFORE_LEASE_END_SECONDS = 0.2


def seconds_until(moment: datetime) -> float:
    return (moment - datetime.now(UTC)).total_seconds()


def hold_effect_lock(database_url: str, effect_id: str, lease_end: datetime, locked: threading.Event) -> None:
    """Another writer: hold the effect's row (SQLite: the database's write lock) across the lease end."""
    time.sleep(max(0.0, seconds_until(lease_end) - LOCK_BEFORE_LEASE_END_SECONDS))
    url = normalize_url(database_url)
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.split("///", 1)[1], isolation_level=None, timeout=10)
        connection.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(max(0.0, seconds_until(lease_end) + LOCK_AFTER_LEASE_END_SECONDS))
        connection.execute("COMMIT")
        connection.close()
        return
    with psycopg.connect(psycopg_url(url)) as connection:
        connection.execute("SELECT effect_id FROM effects WHERE effect_id = %s FOR UPDATE", (effect_id,))
        locked.set()
        time.sleep(max(0.0, seconds_until(lease_end) + LOCK_AFTER_LEASE_END_SECONDS))
        connection.commit()


def authorized(agent, admin, key: str, lease_seconds: int = 2):
    admin.tools.PutToolContract(
        contract(
            effect_class=common_pb2.COMPENSATABLE,
            provider_idempotency=False,
            lease_seconds=lease_seconds,
            queryable=True,
            allowed_recovery=(common_pb2.QUERY_THEN_RETRY,),
        )
    )
    run_id = new_run(agent)
    decision = agent.gate.AuthorizeEffect(authorize_request(run_id, key))
    assert outcome_name(decision) == "ALLOW"
    return run_id, decision


def event_types(client, run_id: str) -> list[str]:
    events = client.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
    return [event.type for event in events]


def test_a_dispatch_that_reaches_the_lock_after_the_lease_ran_out_is_refused(database_url, agent, admin):
    run_id, decision = authorized(agent, admin, "edge-1")
    lease_end = decision.lease_expires_at.ToDatetime(tzinfo=UTC)
    locked = threading.Event()
    holder = threading.Thread(target=hold_effect_lock, args=(database_url, decision.effect_id, lease_end, locked))
    holder.start()
    try:
        assert locked.wait(5), "the second connection never took the lock"
        time.sleep(max(0.0, seconds_until(lease_end) - DISPATCH_BEFORE_LEASE_END_SECONDS))
        assert seconds_until(lease_end) > 0, "the dispatch must be sent before the lease ends"
        with raises_error("FAILED_PRECONDITION", "LEASE_EXPIRED"):
            agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=decision.attempt_id))
        assert raises_error.last.metadata["attempt_id"] == decision.attempt_id
        assert raises_error.last.metadata["stage"] == "UNKNOWN"
    finally:
        holder.join()
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=decision.effect_id))
    assert stage_name(effect.attempts[0].stage) == "UNKNOWN" and not effect.attempts[0].HasField("dispatched_at")
    types = event_types(agent, run_id)
    assert "attempt.lease_expired" in types and "attempt.dispatched" not in types
    assert types[-1] == "attempt.report_refused"
    # The refused sender never sent; the owner may say so at once with the provider's lookup (a
    # QUERY_THEN_RETRY tool), and the effect is retried.
    agent.gate.ReconcileEffect(not_happened(decision.effect_id, "dispatch refused; never sent", lookup=True))
    again = agent.gate.AuthorizeEffect(authorize_request(run_id, "edge-1"))
    assert outcome_name(again) == "ALLOW" and again.attempt_id != decision.attempt_id


def test_a_renewal_that_reaches_the_lock_after_the_lease_ran_out_is_refused(database_url, agent, admin):
    run_id, decision = authorized(agent, admin, "edge-renew")
    lease_end = decision.lease_expires_at.ToDatetime(tzinfo=UTC)
    locked = threading.Event()
    holder = threading.Thread(target=hold_effect_lock, args=(database_url, decision.effect_id, lease_end, locked))
    holder.start()
    try:
        assert locked.wait(5)
        time.sleep(max(0.0, seconds_until(lease_end) - DISPATCH_BEFORE_LEASE_END_SECONDS))
        with raises_error("FAILED_PRECONDITION", "LEASE_EXPIRED"):
            agent.gate.RenewLease(gate_pb2.RenewLeaseRequest(attempt_id=decision.attempt_id))
    finally:
        holder.join()
    assert "attempt.lease_expired" in event_types(agent, run_id)


def test_a_dispatch_just_before_the_lease_end_gets_a_lease_from_its_lock_time(database_url, agent, admin):
    run_id, decision = authorized(agent, admin, "edge-live")
    lease_end = decision.lease_expires_at.ToDatetime(tzinfo=UTC)
    time.sleep(max(0.0, seconds_until(lease_end) - 0.6))
    sent_at = datetime.now(UTC)
    dispatched = agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=decision.attempt_id))
    assert stage_name(dispatched.attempt.stage) == "DISPATCHED"
    new_end = dispatched.attempt.lease_expires_at.ToDatetime(tzinfo=UTC)
    # A full lease (2 s) from a time no earlier than the call: the clock was read under the lock.
    assert (new_end - sent_at).total_seconds() >= 2 - 0.05
    agent.gate.RecordOutcome(succeeded(decision.attempt_id))


def test_a_read_that_shows_unknown_has_recorded_it(database_url, agent, admin):
    run_id, decision = authorized(agent, admin, "edge-read", lease_seconds=1)
    time.sleep(max(0.0, seconds_until(decision.lease_expires_at.ToDatetime(tzinfo=UTC))) + 0.05)
    shown = agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects
    assert [stage_name(e.attempts[0].stage) for e in shown] == ["UNKNOWN"]
    # Whoever recorded it (this read, or the sweeper before it), it is in the trace now, and a
    # late dispatch cannot make it DISPATCHED again.
    assert "attempt.lease_expired" in event_types(agent, run_id)
    with raises_error("FAILED_PRECONDITION", "LEASE_EXPIRED"):
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=decision.attempt_id))


def test_not_happened_from_another_principal_waits_out_the_lease_and_its_grace(tenant, server, agent, admin):
    run_id, decision = authorized(agent, admin, "edge-grace", lease_seconds=1)
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=decision.attempt_id))
    tenant.add("reconciler", "operator")
    reconciler = tenant.client(server, "reconciler")
    not_happened = gate_pb2.ReconcileEffectRequest(
        effect_id=decision.effect_id,
        not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="the provider has nothing yet"),
    )
    try:
        # While the sender's lease runs, and for a grace as long as the lease after it ends
        # (the server's default), another principal's "not happened" is refused.
        for settle in (reconciler, admin):
            with raises_error("FAILED_PRECONDITION", "RECONCILE_TOO_EARLY"):
                settle.gate.ReconcileEffect(not_happened)
        settle_after = datetime.fromisoformat(raises_error.last.metadata["settle_after"])
        dispatched = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=decision.effect_id)).attempts[0]
        lease_end = dispatched.lease_expires_at.ToDatetime(tzinfo=UTC)
        assert abs((settle_after - lease_end).total_seconds() - 1.0) < 0.01
        time.sleep(max(0.0, seconds_until(lease_end)) + 0.1)
        with raises_error("FAILED_PRECONDITION", "RECONCILE_TOO_EARLY"):
            reconciler.gate.ReconcileEffect(not_happened)
        time.sleep(max(0.0, seconds_until(settle_after)) + 0.1)
        settled = reconciler.gate.ReconcileEffect(not_happened)
        assert stage_name(settled.stage) == "FAILED"
        assert "effect.reconcile_refused" in event_types(agent, run_id)
    finally:
        reconciler.close()


def test_a_receipt_settles_at_once_and_the_owner_may_say_not_happened_at_once_with_a_lookup(
    tenant, server, agent, admin
):
    run_id, first = authorized(agent, admin, "edge-receipt", lease_seconds=30)
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    receipt = common_pb2.Receipt(provider_reference="msg-7", detail_json=b"{}")
    settled = admin.gate.ReconcileEffect(gate_pb2.ReconcileEffectRequest(effect_id=first.effect_id, receipt=receipt))
    assert stage_name(settled.stage) == "SUCCEEDED"
    second = agent.gate.AuthorizeEffect(authorize_request(run_id, "edge-receipt-2"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=second.attempt_id))
    owned = agent.gate.ReconcileEffect(not_happened(second.effect_id, "my request never left", lookup=True))
    assert stage_name(owned.stage) == "FAILED"


def test_a_dispatch_of_a_failed_attempt_is_refused_and_after_success_changes_nothing(agent, admin):
    run_id, first = authorized(agent, admin, "edge-settled", lease_seconds=30)
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    agent.gate.RecordOutcome(
        gate_pb2.RecordOutcomeRequest(
            attempt_id=first.attempt_id,
            failed=gate_pb2.RecordOutcomeRequest.Failed(reason="400", evidence=gate_pb2.PROVIDER_REJECTED),
        )
    )
    with raises_error("FAILED_PRECONDITION", "ATTEMPT_SETTLED"):
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=first.attempt_id))
    second = agent.gate.AuthorizeEffect(authorize_request(run_id, "edge-settled"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=second.attempt_id))
    agent.gate.RecordOutcome(succeeded(second.attempt_id))
    # A retried dispatch after the success is an echo: nothing changes, and nothing is sent.
    echo = agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=second.attempt_id))
    assert not echo.changed and stage_name(echo.attempt.stage) == "SUCCEEDED"


def test_begin_dispatched_starts_the_attempt_dispatched_and_a_lost_sender_ends_unknown(agent, admin):
    admin.tools.PutToolContract(
        contract(effect_class=common_pb2.COMPENSATABLE, provider_idempotency=False, lease_seconds=1)
    )
    run_id = new_run(agent)
    request = authorize_request(run_id, "edge-begin")
    request.begin_dispatched = True
    decision = agent.gate.AuthorizeEffect(request)
    assert outcome_name(decision) == "ALLOW" and stage_name(decision.effect_stage) == "DISPATCHED"
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=decision.effect_id))
    assert stage_name(effect.stage) == "DISPATCHED" and effect.attempts[0].HasField("dispatched_at")
    # Nothing can release it: the runtime may have sent it.
    with raises_error("FAILED_PRECONDITION", "ATTEMPT_NOT_RELEASABLE"):
        agent.gate.ReleaseAttempt(gate_pb2.ReleaseAttemptRequest(attempt_id=decision.attempt_id))
    # The runtime goes silent: the lease runs out and the attempt is UNKNOWN, never RELEASED.
    time.sleep(max(0.0, seconds_until(decision.lease_expires_at.ToDatetime(tzinfo=UTC))) + 0.05)
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=decision.effect_id))
    assert stage_name(effect.stage) == "UNKNOWN"
    types = event_types(agent, run_id)
    assert types[1:3] == ["effect.authorized", "attempt.dispatched"] and "attempt.lease_expired" in types
    assert "attempt.released" not in types
