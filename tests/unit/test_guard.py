"""The guard (transport/guard.py) over a real gRPC server and channel, in this process.

The services here are small generic handlers, so each test can make a call fail exactly where
it wants (before authentication, inside a stream, after a while); the tokens are checked by a
plain function standing where the server checks the database. What the product's services
do under the guard is tested end to end in tests/e2e/test_exposure.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from effect_ledger.client import error_from_rpc
from effect_ledger.config import Limits
from effect_ledger.domain.model import Principal, Role
from effect_ledger.errors import InvalidArgument, Unauthenticated
from effect_ledger.transport.guard import Guard, authenticated_as

pytestmark = pytest.mark.asyncio(loop_scope="session")

GOOD = {
    "tok-a": Principal("t1", "alice", frozenset({Role.AGENT})),
    "tok-b": Principal("t1", "bob", frozenset({Role.AGENT})),
}
WATCH = "/effectledger.v1.Approvals/WatchApprovals"


async def authenticate(token: str, peer_subject: str | None) -> Principal:
    await asyncio.sleep(0)
    principal = GOOD.get(token)
    if principal is None:
        raise Unauthenticated("unknown or disabled token", reason="TOKEN_UNKNOWN")
    return principal


class Probe:
    """What the handlers saw: whether a body was read, how many upload chunks were consumed."""

    def __init__(self) -> None:
        self.handled = 0
        self.chunks_read = 0
        self.gate = asyncio.Event()


def services(probe: Probe) -> list:
    async def unary(request: bytes, context):
        probe.handled += 1
        if request == b"malformed":
            raise InvalidArgument.field("world", "99 is not a World", reason="ENUM_UNKNOWN")
        if request == b"crash":
            raise KeyError("effect_id")
        if request == b"authenticated-then-malformed":
            authenticated_as(GOOD["tok-a"])
            raise InvalidArgument.field("target", "has a control character")
        if request == b"wait":
            await probe.gate.wait()
        return b"ok"

    async def stream(request: bytes, context):
        probe.handled += 1
        yield b"first"
        if request == b"crash":
            raise KeyError("effect_id")
        while True:
            await asyncio.sleep(0.05)
            if request == b"tick":
                yield b"tick"

    async def upload(request_iterator, context):
        probe.handled += 1
        async for _chunk in request_iterator:
            probe.chunks_read += 1
        return b"stored"

    identity = {"request_deserializer": None, "response_serializer": None}
    return [
        grpc.method_handlers_generic_handler(
            "test.Guarded",
            {
                "Unary": grpc.unary_unary_rpc_method_handler(unary, **identity),
                "Stream": grpc.unary_stream_rpc_method_handler(stream, **identity),
                "Upload": grpc.stream_unary_rpc_method_handler(upload, **identity),
            },
        ),
        grpc.method_handlers_generic_handler(
            "effectledger.v1.Approvals",
            {"WatchApprovals": grpc.unary_stream_rpc_method_handler(stream, **identity)},
        ),
    ]


@contextlib.asynccontextmanager
async def serving(limits: Limits):
    probe = Probe()
    guard = Guard(default_deadline_seconds=2.0, maximum_concurrent_rpcs=4, limits=limits, authenticate=authenticate)
    server = grpc.aio.server(interceptors=[guard], maximum_concurrent_rpcs=4 + 16)
    server.add_generic_rpc_handlers(services(probe))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield probe, guard, channel
    finally:
        await channel.close()
        await server.stop(0)


@pytest_asyncio.fixture(loop_scope="session")
async def served():
    async with serving(Limits(streams_per_principal_max=2, stream_lifetime_max_seconds=1.0)) as parts:
        yield parts


def token(value: str) -> tuple:
    return (("authorization", f"Bearer {value}"),)


def rpc_error_of(error: grpc.aio.AioRpcError):
    """The error as the client library reads it (status details included)."""

    class Adapter(grpc.RpcError):
        def code(self):
            return error.code()

        def details(self):
            return error.details()

        def trailing_metadata(self):
            return error.trailing_metadata()

    return error_from_rpc(Adapter())


async def test_a_call_without_a_token_is_refused_before_its_handler_runs(served):
    probe, _guard, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await channel.unary_unary("/test.Guarded/Unary")(b"malformed", timeout=5)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert rpc_error_of(error.value).reason == "TOKEN_MISSING"
    assert probe.handled == 0


async def test_a_malformed_field_is_reported_only_to_a_known_caller(served):
    _probe, _guard, channel = served
    call = channel.unary_unary("/test.Guarded/Unary")
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await call(b"malformed", metadata=token("forged"), timeout=5)
    assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "World" not in unknown.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as known:
        await call(b"malformed", metadata=token("tok-a"), timeout=5)
    assert known.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error_of(known.value).reason == "ENUM_UNKNOWN"
    # A call that authenticated itself is answered as it failed, with no second check.
    with pytest.raises(grpc.aio.AioRpcError) as after:
        await call(b"authenticated-then-malformed", metadata=token("forged"), timeout=5)
    assert after.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unexpected_errors_leak_no_text_in_unary_calls_and_streams(served):
    _probe, _guard, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await channel.unary_unary("/test.Guarded/Unary")(b"crash", metadata=token("tok-a"), timeout=5)
    stream = channel.unary_stream("/test.Guarded/Stream")(b"crash", metadata=token("tok-a"), timeout=5)
    assert await stream.read() == b"first"
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        await stream.read()
    for error in (unary.value, streamed.value):
        assert error.code() == grpc.StatusCode.INTERNAL
        assert error.details() == "internal error"
        assert "effect_id" not in (error.debug_error_string() or "")


async def test_an_upload_is_not_read_before_its_caller_is_authenticated(served):
    probe, _guard, channel = served
    sent = 0

    async def chunks():
        nonlocal sent
        for _ in range(30):
            sent += 1
            yield b"x" * (1024 * 1024)

    for metadata in ((), token("forged")):
        sent = 0
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await channel.stream_unary("/test.Guarded/Upload")(chunks(), metadata=metadata, timeout=10)
        # The refusal, or (when the client was still sending as the server closed the call)
        # grpc.aio's own report of that failed send, made by the client library itself.
        client_side = (error.value.code(), error.value.details()) == (
            grpc.StatusCode.INTERNAL,
            "Internal error from Core",
        )
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED or client_side, error.value
        assert probe.chunks_read == 0 and probe.handled == 0
        assert sent < 30, "the client was let to send the whole upload"
    stored = await channel.stream_unary("/test.Guarded/Upload")(chunks(), metadata=token("tok-a"), timeout=10)
    assert stored == b"stored" and probe.chunks_read == 30


async def test_streams_per_principal_are_capped_and_given_back(served):
    _probe, _guard, channel = served
    watch = channel.unary_stream("/test.Guarded/Stream")
    first = [watch(b"idle", metadata=token("tok-a"), timeout=10) for _ in range(2)]
    for call in first:
        assert await call.read() == b"first"
    extra = watch(b"idle", metadata=token("tok-a"), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await extra.read()
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    refusal = rpc_error_of(error.value)
    assert refusal.reason == "STREAMS_EXHAUSTED" and refusal.metadata == {"streams_per_principal_max": "2"}
    # Another principal is not affected; a cancelled stream gives its slot back.
    other = watch(b"idle", metadata=token("tok-b"), timeout=10)
    assert await other.read() == b"first"
    first[0].cancel()
    deadline = time.monotonic() + 5
    while True:
        again = watch(b"idle", metadata=token("tok-a"), timeout=10)
        try:
            assert await again.read() == b"first"
            break
        except grpc.aio.AioRpcError as refused:
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
            await asyncio.sleep(0.05)
    for call in (first[1], other, again):
        call.cancel()


async def test_streams_end_at_their_lifetime(served):
    _probe, _guard, channel = served
    # WatchApprovals ends normally: the client resumes from its cursor.
    started = time.monotonic()
    watch = channel.unary_stream(WATCH)(b"tick", metadata=token("tok-a"), timeout=30)
    received = [message async for message in watch]
    assert received[0] == b"first" and len(received) > 3
    assert await watch.code() == grpc.StatusCode.OK
    assert 0.9 <= time.monotonic() - started < 5
    # Any other stream, even with a longer deadline of its own, ends with DEADLINE_EXCEEDED.
    other = channel.unary_stream("/test.Guarded/Stream")(b"tick", metadata=token("tok-b"), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _message in other:
            pass
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 8


async def test_a_call_without_a_deadline_gets_the_default_one(served):
    probe, _guard, channel = served
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await channel.unary_unary("/test.Guarded/Unary")(b"wait", metadata=token("tok-a"))
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 1.9 <= time.monotonic() - started < 5
    probe.gate.set()


async def test_streams_without_a_deadline_get_the_default_one():
    """A server stream and a client stream that bring no deadline end with DEADLINE_EXCEEDED
    at the default deadline (2 s here), not at the stream lifetime (60 s here). (WatchApprovals
    and WatchDueIntents run to their lifetime instead, and end normally: the test above.)"""
    async with serving(Limits(stream_lifetime_max_seconds=60.0)) as (probe, _guard, channel):
        never = asyncio.Event()

        async def chunks():
            yield b"one"
            await never.wait()  # the client never ends its upload
            yield b"two"

        async def listen() -> grpc.aio.AioRpcError:
            stream = channel.unary_stream("/test.Guarded/Stream")(b"idle", metadata=token("tok-a"))
            with pytest.raises(grpc.aio.AioRpcError) as error:
                async for _message in stream:
                    pass
            return error.value

        async def upload() -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await channel.stream_unary("/test.Guarded/Upload")(chunks(), metadata=token("tok-a"))
            return error.value

        started = time.monotonic()
        listened, uploaded = await asyncio.gather(listen(), upload())
        elapsed = time.monotonic() - started
        never.set()
        assert listened.code() == grpc.StatusCode.DEADLINE_EXCEEDED, listened
        assert uploaded.code() == grpc.StatusCode.DEADLINE_EXCEEDED, uploaded
        assert probe.chunks_read == 1
        assert 1.9 <= elapsed < 10


async def test_admission_is_capped_and_health_is_never_refused(served):
    probe, guard, channel = served
    call = channel.unary_unary("/test.Guarded/Unary")
    waiting = [asyncio.ensure_future(call(b"wait", metadata=token("tok-a"), timeout=10)) for _ in range(4)]
    while guard.in_flight < 4:
        await asyncio.sleep(0.01)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call(b"fast", metadata=token("tok-a"), timeout=5)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    refusal = rpc_error_of(error.value)
    assert refusal.reason == "SERVER_BUSY"
    checker = health_pb2_grpc.HealthStub(channel)
    answers = await asyncio.gather(*(checker.Check(health_pb2.HealthCheckRequest(), timeout=5) for _ in range(10)))
    assert {answer.status for answer in answers} == {health_pb2.HealthCheckResponse.SERVING}
    probe.gate.set()
    assert await asyncio.gather(*waiting) == [b"ok"] * 4
    assert guard.in_flight == 0
    assert await call(b"fast", metadata=token("tok-a"), timeout=5) == b"ok"


async def test_each_token_is_rate_limited_before_anything_else():
    limits = Limits(requests_per_second_per_token=4.0, request_burst_per_token=4)
    async with serving(limits) as (probe, _guard, channel):
        call = channel.unary_unary("/test.Guarded/Unary")
        assert [await call(b"fast", metadata=token("tok-a"), timeout=5) for _ in range(4)] == [b"ok"] * 4
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call(b"fast", metadata=token("tok-a"), timeout=5)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        refusal = rpc_error_of(error.value)
        assert refusal.reason == "RATE_LIMITED" and refusal.metadata == {"requests_per_second": "4", "burst": "4"}
        assert probe.handled == 4
        # Any token, known or not, has a bucket: a flood is refused before its handler (or the
        # database) is asked anything.
        for _ in range(4):
            await call(b"fast", metadata=token("forged"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as forged:
            await call(b"fast", metadata=token("forged"), timeout=5)
        assert rpc_error_of(forged.value).reason == "RATE_LIMITED"
        assert probe.handled == 8
        # Another token has its own bucket; the first one's refills at the rate.
        assert await call(b"fast", metadata=token("tok-b"), timeout=5) == b"ok"
        await asyncio.sleep(0.3)
        assert await call(b"fast", metadata=token("tok-a"), timeout=5) == b"ok"
