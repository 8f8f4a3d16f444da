"""The approval feed is pushed: WatchApprovals streams wait for the database, they do not poll it.

On PostgreSQL a trigger announces every approval event with NOTIFY and each server process
LISTENs on one dedicated connection (application_name ``effect-ledger-listen/<pid>``); on SQLite
one cheap counter poll per process per second wakes the streams. These tests use real server
processes over real gRPC channels:

- a decision made through DecideApproval reaches an open stream (both backends);
- PostgreSQL: a request filed through another server process, and a change committed by hand
  by another database connection, reach a stream on the first process while its LISTEN
  connection stays up (no reconnect, so no wake-everyone and no fallback poll delivered them);
- PostgreSQL: after the LISTEN connection is terminated, changes still arrive, and it comes back;
- PostgreSQL: 128 idle streams make no database transactions (the database's own xact_commit
  counter), the 129th stream is refused with RESOURCE_EXHAUSTED, and slots come back when a
  stream ends by cancellation or by its deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager

import grpc
import psycopg
import pytest

from effect_ledger.client import error_from_rpc
from effect_ledger.config import Limits
from effect_ledger.storage.notifications import LISTEN_APPLICATION_NAME, WATCHERS_MAX
from effectledger.v1 import approvals_pb2, common_pb2
from support import (
    PG_ADMIN_URL,
    ServerProcess,
    contract,
    new_run,
    new_tenant,
    psycopg_url,
    servers_on_fresh_database,
)

TOOL = "payment.wire"
TARGET = "bank:acct-1"
# Generous: an event is pushed at once (PostgreSQL) or found by the next 1 s poll (SQLite).
EVENT_WAIT_SECONDS = 10.0
STREAM_SECONDS = 60.0
IDLE_WINDOWS_MAX = 3
# With the lease sweeper and the scheduler asleep (each reads the database once a second
# otherwise), only the health monitor touches the database (SELECT 1, rolled back: counted in
# xact_rollback, never in xact_commit) besides what these tests do. One pooled connection keeps
# PostgreSQL's statistics prompt (see the idle test).
QUIET_SERVER_ARGS = [
    # A tenant's share of the calls (a quarter of the process's by default) is tested apart
    # (test_tenant_fairness.py); here a tenant's streams fill half of the watchers and its
    # reviewer still decides.
    "--calls-per-tenant-max",
    "256",
    "--lease-sweep-interval-seconds",
    "3600",
    "--scheduler-interval-seconds",
    "3600",
    "--database-pool-size",
    "1",
]


# --- helpers -------------------------------------------------------------------------------


def irreversible():
    return contract(TOOL, effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)


def request_approval(client, run_id: str, arguments: bytes = b'{"amount":1}') -> approvals_pb2.Approval:
    return client.approvals.RequestApproval(
        approvals_pb2.RequestApprovalRequest(run_id=run_id, tool=TOOL, arguments_json=arguments, target=TARGET)
    )


def decide(client, approval_id: str) -> approvals_pb2.Approval:
    return client.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="fine")
    )


class Stream:
    """An open WatchApprovals stream, drained by a thread into a queue."""

    def __init__(self, client, *, after_sequence: int = 0, seconds: float = STREAM_SECONDS) -> None:
        self.call = client.approvals.WatchApprovals(
            approvals_pb2.WatchApprovalsRequest(after_sequence=after_sequence), timeout=seconds
        )
        self.events: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            for event in self.call:
                self.events.put(event)
        except grpc.RpcError as error:
            self.error = error
        self.events.put(None)

    def next(self, timeout: float = EVENT_WAIT_SECONDS) -> approvals_pb2.ApprovalEvent:
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout} s") from None
        assert event is not None, f"the stream ended: {self.error}"
        return event

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(timeout=5)


@contextmanager
def stream(client, **options):
    opened = Stream(client, **options)
    try:
        yield opened
    finally:
        opened.close()


def admin_query(sql: str, parameters: tuple = ()) -> list[tuple]:
    """From the maintenance database, so that reading the statistics adds nothing to them."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as connection:
        return connection.execute(sql, parameters).fetchall()


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def listener(server: ServerProcess, url: str) -> tuple[int, object, str] | None:
    """(pid, backend_start, last query) of the server's LISTEN connection, if it is connected."""
    rows = admin_query(
        "SELECT pid, backend_start, query FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        (database_name(url), f"{LISTEN_APPLICATION_NAME}/{server.process.pid}"),
    )
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def wait_for_listener(server: ServerProcess, url: str, *, other_than: int | None = None, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = listener(server, url)
        if found is not None and found[0] != other_than and found[2].startswith("LISTEN"):
            return found
        time.sleep(0.05)
    raise AssertionError(f"no LISTEN connection for server {server.process.pid}:\n{server.log()}")


def last_sequence(url: str, tenant) -> int:
    """The tenant's last approval event sequence (0 before the first)."""
    with psycopg.connect(psycopg_url(url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT value FROM tenant_counters WHERE tenant_id = %s AND name = 'approval_events'", (tenant.name,)
        ).fetchone()
    return row[0] if row else 0


def committed_transactions(url: str) -> int:
    ((value,),) = admin_query("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database_name(url),))
    return value


def steady_commits(url: str, quiet_seconds: float, timeout: float) -> int:
    """xact_commit once it has not moved for ``quiet_seconds`` (earlier work is flushed into it)."""
    deadline = time.monotonic() + timeout
    value, since = committed_transactions(url), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = committed_transactions(url)
        if current != value:
            value, since = current, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return value
    raise AssertionError(f"the database never went quiet: xact_commit still moving after {timeout} s")


# --- both backends -------------------------------------------------------------------------


def test_a_decision_reaches_an_open_stream(agent, admin, reviewer, tenant, server):
    admin.tools.PutToolContract(irreversible())
    run_id = new_run(agent)
    with tenant.client(server, "auditor") as auditor, stream(auditor) as watching:
        requested = request_approval(agent, run_id)
        first = watching.next()
        assert (first.sequence, first.type) == (1, "approval.requested")
        assert first.approval.approval_id == requested.approval_id
        decide(reviewer, requested.approval_id)
        second = watching.next()
        assert (second.sequence, second.type, second.principal_id) == (2, "approval.approved", "reviewer")
        assert second.approval.state == approvals_pb2.APPROVED
        assert [vote.reviewer_id for vote in second.approval.votes] == ["reviewer"]


# --- PostgreSQL: pushed by the database ----------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    """Two quiet server processes on one fresh PostgreSQL database, and a tenant with the tool."""
    with servers_on_fresh_database("el_feed", 2, QUIET_SERVER_ARGS) as (url, servers, tenant):
        with tenant.client(servers[0], "admin") as admin:
            admin.tools.PutToolContract(irreversible())
        for server in servers:
            wait_for_listener(server, url)
        yield url, servers, tenant


@pytest.mark.postgres
@pytest.mark.multiprocess
def test_a_request_filed_through_another_server_process_reaches_the_stream(pair):
    url, (first, second), tenant = pair
    before = wait_for_listener(first, url)
    backlog = last_sequence(url, tenant)
    with (
        tenant.client(first, "auditor") as auditor,
        stream(auditor, after_sequence=backlog) as watching,
        tenant.client(second, "agent") as agent,
        tenant.client(second, "reviewer") as reviewer,
    ):
        requested = request_approval(agent, new_run(agent), arguments=b'{"amount":2}')
        event = watching.next()
        assert (event.sequence, event.type, event.approval.approval_id) == (
            backlog + 1,
            "approval.requested",
            requested.approval_id,
        )
        decide(reviewer, requested.approval_id)
        assert watching.next().type == "approval.approved"
    # The same LISTEN connection all along: no reconnect (and so no catch-up read) delivered them.
    assert wait_for_listener(first, url)[:2] == before[:2]


@pytest.mark.postgres
@pytest.mark.multiprocess
def test_a_change_committed_by_another_database_connection_reaches_the_stream(pair):
    url, (first, _second), tenant = pair
    with tenant.client(first, "agent") as agent, tenant.client(first, "auditor") as auditor:
        approval = request_approval(agent, new_run(agent), arguments=b'{"amount":3}')
        before = wait_for_listener(first, url)
        backlog = last_sequence(url, tenant)
        with stream(auditor, after_sequence=backlog) as watching:
            # What RevokeApproval commits, committed by hand by a connection no server knows of.
            with psycopg.connect(psycopg_url(url)) as connection:
                connection.execute(
                    "UPDATE approvals SET state = 'REVOKED', revoked_by = 'dba', revoke_reason = 'by hand',"
                    " updated_at = now() WHERE tenant_id = %s AND approval_id = %s",
                    (tenant.name, approval.approval_id),
                )
                (sequence,) = connection.execute(
                    "UPDATE tenant_counters SET value = value + 1 WHERE tenant_id = %s AND name = 'approval_events'"
                    " RETURNING value",
                    (tenant.name,),
                ).fetchone()
                connection.execute(
                    "INSERT INTO approval_events (tenant_id, sequence, approval_id, run_id, tool, type,"
                    " principal_id, created_at) VALUES (%s, %s, %s, %s, %s, 'approval.revoked', 'dba', now())",
                    (tenant.name, sequence, approval.approval_id, approval.run_id, TOOL),
                )
            event = watching.next()
            assert (event.sequence, event.type, event.principal_id) == (backlog + 1, "approval.revoked", "dba")
            assert event.approval.state == approvals_pb2.REVOKED and event.approval.revoke_reason == "by hand"
        assert wait_for_listener(first, url)[:2] == before[:2]


@pytest.mark.postgres
@pytest.mark.multiprocess
def test_the_stream_keeps_receiving_after_the_listen_connection_is_killed(pair):
    url, (first, second), tenant = pair
    backlog = last_sequence(url, tenant)
    with (
        tenant.client(first, "auditor") as auditor,
        stream(auditor, after_sequence=backlog) as watching,
        tenant.client(second, "agent") as agent,
    ):
        run_id = new_run(agent)
        killed, *_ = wait_for_listener(first, url)
        ((terminated,),) = admin_query("SELECT pg_terminate_backend(%s)", (killed,))
        assert terminated
        # Committed while the server may still be reconnecting: the catch-up read finds it.
        during = request_approval(agent, run_id, arguments=b'{"amount":4}')
        assert watching.next().approval.approval_id == during.approval_id
        wait_for_listener(first, url, other_than=killed)
        after = request_approval(agent, run_id, arguments=b'{"amount":5}')
        assert watching.next().approval.approval_id == after.approval_id
    assert "LISTEN connection lost" in first.log()


@pytest.mark.postgres
@pytest.mark.multiprocess
def test_idle_streams_make_no_database_transactions_and_the_streams_are_bounded(pair):
    """128 idle streams, then the database's own count of committed transactions over 2 s.

    A pool of one connection keeps the statistics prompt: PostgreSQL flushes a backend's
    counters when it ends a transaction a second or more after its last flush (otherwise up to
    10 s later), and the health monitor's SELECT 1 (rolled back, so not itself counted in
    xact_commit) ends one on that connection every second. The control at the end shows the
    count is not blind: one decision in each tenant wakes every stream, and each re-read is a
    committed transaction.
    """
    url, (server, _second), _tenant = pair
    # A tenant holds at most half of a process's watchers: two tenants fill it. Their events
    # start at 1.
    tenants = [new_tenant(url), new_tenant(url)]
    streams: list = []
    clients: list = []
    try:
        approvals = []
        for tenant in tenants:
            with tenant.client(server, "admin") as admin, tenant.client(server, "agent") as agent:
                admin.tools.PutToolContract(irreversible())
                approvals.append(request_approval(agent, new_run(agent)))
        wait_for_listener(server, url)
        # Streams per principal are capped (Limits.streams_per_principal_max): enough auditors
        # in each tenant that the process-wide cap is the one reached.
        per_tenant = WATCHERS_MAX // len(tenants) // Limits().streams_per_principal_max
        for tenant in tenants:
            for index in range(per_tenant):
                tenant.add(f"auditor-{index}", "auditor")
                clients.append(tenant.client(server, f"auditor-{index}"))
        owners = len(clients)
        for index in range(WATCHERS_MAX):
            streams.append(
                clients[index % owners].approvals.WatchApprovals(
                    approvals_pb2.WatchApprovalsRequest(), timeout=STREAM_SECONDS
                )
            )
        for index, call in enumerate(streams):  # each stream has read its tenant's request once
            assert next(call).approval.approval_id == approvals[index % owners // per_tenant].approval_id
        tenant = new_tenant(url)  # a tenant with no stream yet: the process is full
        tenant.add("auditor-extra", "auditor")
        clients.append(tenant.client(server, "auditor-extra"))
        refused = clients[-1].approvals.WatchApprovals(approvals_pb2.WatchApprovalsRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as error:
            next(refused)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_from_rpc(error.value).reason == "WATCHERS_EXHAUSTED"

        # Autovacuum may visit the new database, and on a loaded machine a visit can fall in a
        # window: up to three windows are measured, and one quiet window is enough. Streams
        # that polled would commit 64+ a second in every window.
        windows = []
        for _ in range(IDLE_WINDOWS_MAX):
            start = steady_commits(url, quiet_seconds=2.5, timeout=20.0)
            time.sleep(2.0)
            windows.append(committed_transactions(url) - start)
            if windows[-1] <= 5:
                break
        assert min(windows) <= 5, f"{windows} transactions committed while {WATCHERS_MAX} streams were idle"

        for tenant, approval in zip(tenants, approvals, strict=True):
            with tenant.client(server, "reviewer") as reviewer:
                decide(reviewer, approval.approval_id)
        for call in streams:
            assert next(call).type == "approval.approved"
        deadline = time.monotonic() + 15.0
        while committed_transactions(url) - start < WATCHERS_MAX and time.monotonic() < deadline:
            time.sleep(0.25)
        assert committed_transactions(url) - start >= WATCHERS_MAX, "the count does not see the re-reads"

        # A stream ended by cancellation, then one ended by its deadline, each gives its slot back
        # (both the process's and its principal's).
        streams.pop().cancel()
        owner = clients[(WATCHERS_MAX - 1) % owners]
        short = accepted_stream(owner, seconds=1.0)
        with pytest.raises(grpc.RpcError) as ended:
            next(short)  # nothing more: it waits until its deadline
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        streams.append(accepted_stream(owner, seconds=STREAM_SECONDS))
    finally:
        for call in streams:
            call.cancel()
        for client in clients:
            client.close()


def accepted_stream(client, *, seconds: float, timeout: float = 10.0):
    """A new stream from after the request (it replays the approval), once a slot is free:
    a slot is given back when the server has finished with the stream that held it."""
    deadline = time.monotonic() + timeout
    while True:
        call = client.approvals.WatchApprovals(approvals_pb2.WatchApprovalsRequest(after_sequence=1), timeout=seconds)
        try:
            assert next(call).type == "approval.approved"
            return call
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert time.monotonic() < deadline, "no WatchApprovals slot came back"
        time.sleep(0.1)
