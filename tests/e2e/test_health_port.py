"""``serve --health-listen``: grpc.health.v1 alone on a port of its own, plaintext, unguarded.

Real servers, real channels. The main port's own gRPC cap (--maximum-concurrent-rpcs plus
HEALTH_RESERVE_RPCS) counts every call, health checks and health Watch streams included, so
enough open Watch streams there refuse even a health check on it; the health port, which
shares the main port's health status but nothing else, still answers. After SIGTERM both say
NOT_SERVING while the server drains.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from effect_ledger.transport.server import HEALTH_RESERVE_RPCS, LIVENESS_SERVICE_NAME
from support import ServerProcess, allow_connections, create_pg_database, drop_pg_database, migrate

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CALL_TIMEOUT_SECONDS = 5.0
# The flood's streams live this long at most (they are cancelled once the test has looked).
FLOOD_STREAM_TIMEOUT_SECONDS = 60.0
# A lone server with --maximum-concurrent-rpcs 2: gRPC's cap on its main port.
FLOOD_CAP = 2 + HEALTH_RESERVE_RPCS
DRAIN_GRACE_SECONDS = 3.0
REFUSAL_TIMEOUT_SECONDS = 60.0
# The health monitor pings the database every second.
HEALTH_TURNS_WITHIN_SECONDS = 8.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check(target: str, credentials: grpc.ChannelCredentials | None = None, service: str = "") -> int:
    """grpc.health.v1 Check of ``service`` over a connection of its own (never a pooled one)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    with channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=CALL_TIMEOUT_SECONDS).status


@dataclass
class HealthPortServer(ServerProcess):
    """A ServerProcess with --health-listen on a free port, whose start-up checks go there (the
    main port may speak mTLS, which these checks do not)."""

    health_port: int = 0

    def start(self) -> HealthPortServer:
        self.health_port = self.health_port or free_port()
        self.extra_args = [*self.extra_args, "--health-listen", f"127.0.0.1:{self.health_port}"]
        super().start()
        return self

    @property
    def health_target(self) -> str:
        return f"127.0.0.1:{self.health_port}"

    def health(self, service: str = "", timeout: float = 2.0) -> int:
        with grpc.insecure_channel(self.health_target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from e2e.test_tls import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("main_port", ["plaintext", "mtls"])
def test_the_health_port_answers_serving_in_plaintext_and_serves_health_alone(sqlite_url, pki, main_port):
    env = {}
    if main_port == "mtls":
        env = {
            "EFFECT_LEDGER_TLS_CERT": pki.path("server.pem"),
            "EFFECT_LEDGER_TLS_KEY": pki.path("server-key.pem"),
            "EFFECT_LEDGER_TLS_CLIENT_CA": pki.path("ca.pem"),
        }
    server = HealthPortServer(sqlite_url, env=env).start()
    try:
        assert check(server.health_target) == SERVING
        if main_port == "mtls":  # the main port refuses plaintext; the health port does not ask for it
            with pytest.raises(grpc.RpcError) as refused:
                check(server.target)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        else:
            assert check(server.target) == SERVING
        with grpc.insecure_channel(server.health_target) as channel:  # health, and nothing else
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=CALL_TIMEOUT_SECONDS
            )
            with pytest.raises(grpc.RpcError) as unknown:
                next(reflection)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert f"grpc.health.v1 alone on 127.0.0.1:{server.health_port} (plaintext" in server.full_log()
    finally:
        server.stop()


def test_a_flood_that_fills_the_main_port_leaves_the_health_port_answering(sqlite_url):
    server = HealthPortServer(sqlite_url, ["--maximum-concurrent-rpcs", "2"]).start()
    streams = []
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            refused = None
            # Health Watch streams: never counted by the guard, but gRPC's own cap counts them.
            for _ in range(FLOOD_CAP + 1):
                stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=FLOOD_STREAM_TIMEOUT_SECONDS)
                streams.append(stream)
                try:
                    assert next(stream).status == SERVING
                except grpc.RpcError as error:
                    refused = error
                    break
            assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(streams) == FLOOD_CAP + 1, "the cap refused before it was full"
            with pytest.raises(grpc.RpcError) as on_main_port:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_SECONDS)
            assert on_main_port.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            started = time.monotonic()
            assert check(server.health_target) == SERVING  # within CALL_TIMEOUT_SECONDS
            assert time.monotonic() - started < CALL_TIMEOUT_SECONDS
            for stream in streams:
                stream.cancel()
        assert wait_for(lambda: check_or_none(server.target) == SERVING, 10), "the main port never recovered"
    finally:
        for stream in streams:
            stream.cancel()
        server.stop()


def test_after_sigterm_the_health_port_says_not_serving_as_the_main_port_does(sqlite_url):
    server = HealthPortServer(sqlite_url, ["--grace-seconds", str(DRAIN_GRACE_SECONDS)]).start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            # An open stream on the main port keeps the drain going for its grace, and watches
            # the main port's health through it.
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=DRAIN_GRACE_SECONDS * 4
            )
            assert next(watch).status == SERVING
            assert check(server.health_target) == SERVING
            server.process.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            assert check(server.health_target) == NOT_SERVING
            assert check(server.health_target, service=LIVENESS_SERVICE_NAME) == NOT_SERVING
            assert server.process.poll() is None, "the drain ended before the check"
            assert server.process.wait(timeout=DRAIN_GRACE_SECONDS + 10) == 0
        assert check_or_none(server.health_target) is None  # gone with the server
    finally:
        server.stop()


@pytest.fixture
def lonely_database():
    url = create_pg_database("el_health")
    migrate(url)
    yield url
    allow_connections(url.rsplit("/", 1)[1], True)
    drop_pg_database(url)


@pytest.mark.postgres
def test_liveness_stays_serving_while_the_database_refuses(lonely_database):
    """The kubelet's grpc probe only asks "SERVING?": readiness asks the whole server (""),
    liveness asks LIVENESS_SERVICE_NAME, which a database outage does not turn."""
    server = HealthPortServer(lonely_database).start()
    try:
        assert check(server.health_target, service=LIVENESS_SERVICE_NAME) == SERVING
        allow_connections(lonely_database.rsplit("/", 1)[1], False)
        assert wait_for(lambda: check(server.health_target) == NOT_SERVING, HEALTH_TURNS_WITHIN_SECONDS)
        assert check(server.health_target, service=LIVENESS_SERVICE_NAME) == SERVING
        allow_connections(lonely_database.rsplit("/", 1)[1], True)
        assert wait_for(lambda: check(server.health_target) == SERVING, HEALTH_TURNS_WITHIN_SECONDS)
    finally:
        server.stop()


@pytest.mark.multiprocess
@pytest.mark.postgres
def test_every_worker_serves_the_health_port(pg_url):
    server = HealthPortServer(pg_url, workers=2).start()
    try:
        for _ in range(8):  # connections of their own, spread over the workers by the kernel
            assert check(server.health_target) == SERVING

        def every_worker_says_so() -> bool:
            said = f", health on port {server.health_port}"
            lines = [line for line in server.full_log().splitlines() if said in line]
            return all(any(f"worker {index} (pid" in line for line in lines) for index in (0, 1))

        assert wait_for(every_worker_says_so, 10), server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_health_port_in_use_stops_the_start(sqlite_url, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *(sys.executable, "-m", "effect_ledger", "serve", "--database-url", sqlite_url),
                *("--listen", "127.0.0.1:0", "--workers", workers, "--health-listen", f"127.0.0.1:{port}"),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=REFUSAL_TIMEOUT_SECONDS,
        )
    assert result.returncode == 2, result.stderr
    assert "the port is already in use" in result.stderr and "give a free --health-listen port" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def check_or_none(target: str) -> int | None:
    with contextlib.suppress(grpc.RpcError):
        return check(target)
    return None


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("health_listen", "said"),
    [("127.0.0.1:50999", "--health-listen needs a port of its own"), ("50999", "--health-listen must be HOST:PORT")],
    ids=["the-main-port", "no-host"],
)
def test_a_health_port_that_cannot_be_one_is_refused(sqlite_url, health_listen, said):
    result = subprocess.run(
        [
            *(sys.executable, "-m", "effect_ledger", "serve", "--database-url", sqlite_url),
            *("--listen", "127.0.0.1:50999", "--workers", "1", "--health-listen", health_listen),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT_SECONDS,
    )
    assert result.returncode == 2 and said in result.stderr, result.stderr
