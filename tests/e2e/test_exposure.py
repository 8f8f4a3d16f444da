"""The attacks on the server's exposure that the guard stops, against the real server on each
backend: calls without a valid token learn nothing and cost nothing, streams are bounded.
(The guard's own rules, in isolation: tests/unit/test_guard.py.)"""

from __future__ import annotations

import re
import threading
import time

import grpc
import pytest

from effect_ledger.client import error_from_rpc
from effect_ledger.config import Limits
from effect_ledger.domain.checkpoints import ARCHIVE_SIZE_MAX_BYTES
from effect_ledger.reasons import ERROR_REASONS
from effectledger.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    runs_pb2,
    schedules_pb2,
)
from support import contract, new_run, rss_kib

MIB = 1024 * 1024


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


@pytest.mark.parametrize(
    ("call", "request_message"),
    [
        ("ForkRun", checkpoints_pb2.ForkRunRequest(checkpoint_id="ckpt_x", world=99)),
        (
            "SealCheckpoint",
            checkpoints_pb2.SealCheckpointRequest(
                run_id="run_x", artifacts=[checkpoints_pb2.ArtifactRef(name="a", classification=99)]
            ),
        ),
    ],
)
@pytest.mark.parametrize("metadata", [(), bearer("forged-token")], ids=["no token", "unknown token"])
def test_malformed_requests_from_unknown_callers_answer_unauthenticated(server, call, request_message, metadata):
    with grpc.insecure_channel(server.target) as channel:
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            getattr(stub, call)(request_message, metadata=metadata, timeout=10)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, error.value.details()
    assert error_from_rpc(error.value).reason in ("TOKEN_MISSING", "TOKEN_UNKNOWN")


def test_imports_without_a_valid_token_are_refused_before_they_are_read(server, agent):
    """Eight streams of 30 MiB each, without a token or with a forged one: each is refused
    before the server reads it, the clients never get to send most of it, and the server's
    memory does not grow by the data offered."""
    before = rss_kib(server.process.pid)
    sent = [0] * 8
    results: list = [None] * 8

    def upload(index: int) -> None:
        def chunks():
            for _ in range(30):
                sent[index] += 1
                yield checkpoints_pb2.ArchiveChunk(data=b"\0" * MIB)

        metadata = () if index % 2 else bearer("forged-token")
        with grpc.insecure_channel(server.target) as channel:
            try:
                checkpoints_pb2_grpc.CheckpointsStub(channel).ImportCheckpoint(chunks(), metadata=metadata, timeout=30)
            except grpc.RpcError as error:
                results[index] = error.code()

    threads = [threading.Thread(target=upload, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [grpc.StatusCode.UNAUTHENTICATED] * 8
    assert max(sent) < 30, f"a client was let to send its whole upload: {sent}"
    grown_mib = (rss_kib(server.process.pid) - before) / 1024
    assert grown_mib < 64, f"the server grew by {grown_mib:.0f} MiB"
    # The server still serves a caller with a token.
    assert agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id


def test_an_authenticated_import_is_cut_off_at_the_archive_cap(server, agent, tenant):
    """An agent with a valid token streams 48 MiB into ImportCheckpoint: the server stops
    reading at the cap (32 MiB) and answers INVALID_ARGUMENT on the field ``archive``, before
    the client has sent everything, and nothing is written."""
    total_chunks = 48
    pulled = 0

    def chunks():
        nonlocal pulled
        for _ in range(total_chunks):
            pulled += 1  # the client library pulls a chunk when it can send it
            yield checkpoints_pb2.ArchiveChunk(data=b"\0" * MIB)

    runs_before = agent.runs.ListRuns(runs_pb2.ListRunsRequest()).runs
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as error:
        checkpoints_pb2_grpc.CheckpointsStub(channel).ImportCheckpoint(
            chunks(), metadata=bearer(tenant.tokens["agent"]), timeout=60
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    refusal = error_from_rpc(error.value)
    assert refusal.reason == "ARCHIVE_INVALID"
    assert [(v.field, v.description) for v in refusal.violations] == [
        ("archive", f"is larger than {ARCHIVE_SIZE_MAX_BYTES} bytes")
    ]
    assert ARCHIVE_SIZE_MAX_BYTES // MIB < pulled < total_chunks, f"the client sent {pulled} of {total_chunks} MiB"
    assert agent.runs.ListRuns(runs_pb2.ListRunsRequest()).runs == runs_before


# What an exception's text looks like when it leaks into a status.
LEAK = re.compile(r"Traceback|File \"|\w+(Error|Exception)\b|psycopg|sqlalchemy|asyncio", re.IGNORECASE)


@pytest.mark.parametrize(
    ("service", "method", "role", "request_message", "code", "reason", "field"),
    [
        (
            "Checkpoints",
            "ExportCheckpoint",
            "agent",
            checkpoints_pb2.ExportCheckpointRequest(checkpoint_id="ckpt_missing"),
            grpc.StatusCode.NOT_FOUND,
            "CHECKPOINT_NOT_FOUND",
            None,
        ),
        (
            "Approvals",
            "WatchApprovals",
            "auditor",
            approvals_pb2.WatchApprovalsRequest(after_sequence=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            "after_sequence",
        ),
        (
            "Schedules",
            "WatchDueIntents",
            "agent",
            schedules_pb2.WatchDueIntentsRequest(run_id="run\x00\n\x1b[31m"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ID",
            "run_id",
        ),
    ],
    ids=["export unknown checkpoint", "watch approvals bad cursor", "watch due intents bad run id"],
)
def test_a_failing_stream_answers_its_reason_and_no_exception_text(
    server, tenant, service, method, role, request_message, code, reason, field
):
    """A server-streaming RPC that fails answers the error table's status and reason (a
    catalogued one, with the field it names), and nothing of an exception in its message."""
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_stream(
            f"/effectledger.v1.{service}/{method}",
            request_serializer=type(request_message).SerializeToString,
            response_deserializer=bytes,
        )(request_message, metadata=bearer(tenant.tokens[role]), timeout=10)
        with pytest.raises(grpc.RpcError) as error:
            next(call)
    assert error.value.code() == code, error.value.details()
    refusal = error_from_rpc(error.value)
    assert refusal.reason == reason and reason in {known.code for known in ERROR_REASONS}
    violations = getattr(refusal, "violations", [])  # only field and precondition errors have them
    assert [violation.field for violation in violations] == ([] if field is None else [field])
    texts = (error.value.details(), refusal.message, *refusal.metadata.values(), *(v.description for v in violations))
    for text in texts:
        assert not LEAK.search(text), f"exception text in the status: {text!r}"


def test_idle_streams_without_a_token_hold_no_slot(server, agent):
    """Hundreds of streams opened with no token and never sent on: each is refused at once,
    so a legitimate call right after is served (they once took every slot)."""
    with grpc.insecure_channel(server.target) as channel:
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        never_sent = threading.Event()

        def silent():
            never_sent.wait(30)
            yield from ()

        calls = [stub.ImportCheckpoint.future(silent(), timeout=30) for _ in range(300)]
        try:
            codes = [call.exception(timeout=20).code() for call in calls]
            assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
            started = time.monotonic()
            assert agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
            assert time.monotonic() - started < 5
        finally:
            never_sent.set()


def test_a_principal_gets_a_bounded_number_of_streams(server, tenant, agent, admin, database_url):
    """Eight WatchApprovals streams of one principal are served (each reads the tenant's one
    approval event); the ninth is refused with RESOURCE_EXHAUSTED; another principal is not,
    nor the principal of the same name in another tenant (principal ids are per tenant)."""
    from support import new_tenant

    cap = Limits().streams_per_principal_max
    admin.tools.PutToolContract(
        contract(
            "wire.send",
            effect_class=common_pb2.IRREVERSIBLE,
            provider_idempotency=False,
            max_attempts=1,
        )
    )
    agent.approvals.RequestApproval(
        approvals_pb2.RequestApprovalRequest(
            run_id=new_run(agent), tool="wire.send", arguments_json=b"{}", target="acct:1"
        )
    )
    token = tenant.tokens["auditor"]
    with grpc.insecure_channel(server.target) as channel:
        stub = approvals_pb2_grpc.ApprovalsStub(channel)
        open_streams = []
        try:
            for _ in range(cap):
                call = stub.WatchApprovals(approvals_pb2.WatchApprovalsRequest(), metadata=bearer(token), timeout=30)
                open_streams.append(call)
                assert next(call).type == "approval.requested"  # served: it holds its slot
            extra = stub.WatchApprovals(approvals_pb2.WatchApprovalsRequest(), metadata=bearer(token), timeout=10)
            with pytest.raises(grpc.RpcError) as error:
                next(extra)
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refusal = error_from_rpc(error.value)
            assert refusal.reason == "STREAMS_EXHAUSTED"
            assert refusal.metadata == {"streams_per_principal_max": str(cap)}
            # Another principal of the same tenant still gets a stream.
            other = stub.WatchApprovals(
                approvals_pb2.WatchApprovalsRequest(),
                metadata=bearer(tenant.tokens["reviewer"]),
                timeout=10,
            )
            assert next(other).type == "approval.requested"
            other.cancel()
            # The "auditor" of another tenant is another principal: it streams too (it reads
            # nothing, its tenant has no approval, so the stream runs until its deadline).
            namesake = stub.WatchApprovals(
                approvals_pb2.WatchApprovalsRequest(),
                metadata=bearer(new_tenant(database_url).tokens["auditor"]),
                timeout=1,
            )
            with pytest.raises(grpc.RpcError) as quiet:
                next(namesake)
            assert quiet.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, quiet.value.details()
        finally:
            for call in open_streams:
                call.cancel()


@pytest.fixture(scope="module")
def quota_server(database_url):
    from support import ServerProcess

    running = ServerProcess(database_url, ["--open-approval-requests-per-tenant-max", "2"]).start()
    yield running
    running.stop()


def test_open_approval_requests_are_a_tenant_quota(quota_server, database_url):
    from support import new_tenant

    def request(client, run_id: str, target: str):
        return client.approvals.RequestApproval(
            approvals_pb2.RequestApprovalRequest(run_id=run_id, tool="wire.send", arguments_json=b"{}", target=target)
        )

    tenant, other = new_tenant(database_url), new_tenant(database_url)
    for owner in (tenant, other):
        with owner.client(quota_server, "admin") as admin:
            admin.tools.PutToolContract(
                contract("wire.send", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
            )
    with tenant.client(quota_server, "agent") as agent, tenant.client(quota_server, "reviewer") as reviewer:
        run_id = new_run(agent)
        first = request(agent, run_id, "acct:1")
        request(agent, run_id, "acct:2")
        assert request(agent, run_id, "acct:1").approval_id == first.approval_id  # the open one again
        with pytest.raises(Exception) as error:
            request(agent, run_id, "acct:3")
        refusal = error.value
        assert refusal.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refusal.reason == "QUOTA_EXCEEDED" and refusal.metadata["limit"] == "2"
        # Another tenant has a quota of its own; a decided request no longer counts.
        with other.client(quota_server, "agent") as stranger:
            assert request(stranger, new_run(stranger), "acct:3").approval_id
        reviewer.approvals.DecideApproval(
            approvals_pb2.DecideApprovalRequest(approval_id=first.approval_id, approve=False, comment="no")
        )
        assert request(agent, run_id, "acct:3").approval_id


@pytest.fixture(scope="module")
def small_quota_server(database_url):
    from support import ServerProcess

    running = ServerProcess(
        database_url, ["--artifacts-per-tenant-max", "2", "--snapshots-per-tenant-max", "2"]
    ).start()
    yield running
    running.stop()


def test_artifacts_and_snapshots_are_tenant_quotas(small_quota_server, database_url):
    from support import new_tenant

    tenant = new_tenant(database_url)
    with tenant.client(small_quota_server, "agent") as agent:
        put = agent.checkpoints.PutArtifact
        first = put(checkpoints_pb2.PutArtifactRequest(content=b"one", media_type="text/plain"))
        put(checkpoints_pb2.PutArtifactRequest(content=b"two", media_type="text/plain"))
        put(checkpoints_pb2.PutArtifactRequest(content=b"one", media_type="text/plain"))  # already stored
        for refused in (
            lambda: put(checkpoints_pb2.PutArtifactRequest(content=b"three", media_type="text/plain")),
            lambda: agent.checkpoints.DeclareArtifact(
                checkpoints_pb2.DeclareArtifactRequest(digest="sha256:" + "0" * 64, size_bytes=10)
            ),
        ):
            with pytest.raises(Exception) as error:
                refused()
            assert error.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error.value.metadata == {"quota": "stored_artifacts", "limit": "2"}
        # A deleted artifact no longer counts.
        agent.checkpoints.DeleteArtifact(checkpoints_pb2.DeleteArtifactRequest(digest=first.digest))
        assert put(checkpoints_pb2.PutArtifactRequest(content=b"three", media_type="text/plain")).digest

        run_id = new_run(agent)
        for value in (b"1", b"2"):
            agent.checkpoints.RecordSnapshot(checkpoints_pb2.RecordSnapshotRequest(run_id=run_id, value_json=value))
        with pytest.raises(Exception) as error:
            agent.checkpoints.RecordSnapshot(checkpoints_pb2.RecordSnapshotRequest(run_id=run_id, value_json=b"3"))
        assert error.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.value.reason == "QUOTA_EXCEEDED"
        assert error.value.metadata == {"quota": "recorded_snapshots", "limit": "2"}
