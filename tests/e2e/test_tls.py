"""TLS and mTLS: ``serve --tls-cert/--tls-key/--tls-client-ca``, the plaintext rule for
non-loopback addresses (``--insecure``), the client's TLS options, and the verified client
certificate subject a servicer can read (transport/peer.py).

Certificates are made here, per module, with ``cryptography``: a CA, a server certificate for
127.0.0.1 and localhost, a client certificate from that CA, and a client certificate from
another CA. Real server processes, real channels.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from effect_ledger.client import LedgerClient
from effect_ledger.config import ServerSettings
from effect_ledger.transport.peer import client_common_name, client_subject
from effect_ledger.transport.server import server_credentials
from effectledger.v1 import runs_pb2
from support import ServerProcess, new_tenant, raises_error

CALL_TIMEOUT_SECONDS = 10.0
# A server that refuses its flags exits before it migrates or binds anything.
REFUSAL_TIMEOUT_SECONDS = 60.0
SERVING = health_pb2.HealthCheckResponse.SERVING
CLIENT_COMMON_NAME = "agent-7"


# --- certificates ----------------------------------------------------------------------------


@dataclass
class Pki:
    folder: Path
    client_subject: str = ""

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])


def _certificate(subject, public_key, issuer, issuer_key, *, ca=False, names=(), usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(folder: Path, name: str, certificate: x509.Certificate, key) -> None:
    (folder / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}-key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def make_pki(folder: Path) -> Pki:
    """ca.pem; server.pem (127.0.0.1, localhost); client.pem and sibling.pem (two subjects from
    ca.pem); rogue.pem (a client certificate from other-ca.pem); each with its -key.pem."""
    pki = Pki(folder)
    authorities = {}
    for name in ("ca", "other-ca"):
        key = _key()
        subject = _name((NameOID.COMMON_NAME, f"effect-ledger test {name}"))
        authorities[name] = (subject, key)
        _write(folder, name, _certificate(subject, key.public_key(), subject, key, ca=True), key)
    ca_name, ca_key = authorities["ca"]
    server_key = _key()
    server_names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _certificate(
        _name((NameOID.COMMON_NAME, "localhost")),
        server_key.public_key(),
        ca_name,
        ca_key,
        names=server_names,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    _write(folder, "server", server, server_key)
    client_key = _key()
    client = _certificate(
        _name((NameOID.ORGANIZATION_NAME, "Example, Inc"), (NameOID.COMMON_NAME, CLIENT_COMMON_NAME)),
        client_key.public_key(),
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write(folder, "client", client, client_key)
    pki.client_subject = client.subject.rfc4514_string()
    sibling_key = _key()
    sibling = _certificate(
        _name((NameOID.COMMON_NAME, "agent-8")),
        sibling_key.public_key(),
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write(folder, "sibling", sibling, sibling_key)
    other_name, other_key = authorities["other-ca"]
    rogue_key = _key()
    rogue = _certificate(
        _name((NameOID.COMMON_NAME, CLIENT_COMMON_NAME)),
        rogue_key.public_key(),
        other_name,
        other_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write(folder, "rogue", rogue, rogue_key)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def credentials(pki: Pki, client: str | None = None, ca: str = "ca") -> grpc.ChannelCredentials:
    """Trusting ``ca``.pem; presenting ``client``.pem when given."""
    return grpc.ssl_channel_credentials(
        root_certificates=pki.read(f"{ca}.pem"),
        private_key=pki.read(f"{client}-key.pem") if client else None,
        certificate_chain=pki.read(f"{client}.pem") if client else None,
    )


def health_status(target: str, channel_credentials: grpc.ChannelCredentials | None) -> int:
    """grpc.health.v1 Check over a connection of its own (never a pooled one)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if channel_credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, channel_credentials, options=options)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_SECONDS).status


def refused_code(target: str, channel_credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        health_status(target, channel_credentials)
    return failure.value.code()


# --- servers -----------------------------------------------------------------------------------


@dataclass
class TlsServerProcess(ServerProcess):
    """A ServerProcess whose start-up health checks go over TLS (with a client certificate for
    an mTLS server)."""

    channel_credentials: grpc.ChannelCredentials | None = None

    def health(self, service: str = "", timeout: float = 2.0) -> int:
        with grpc.secure_channel(self.target, self.channel_credentials) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


def tls_flags(pki: Pki) -> list[str]:
    return ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server-key.pem")]


@pytest.fixture(scope="module")
def tls_server(pki, sqlite_url):
    running = TlsServerProcess(sqlite_url, tls_flags(pki), channel_credentials=credentials(pki)).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def mtls_server(pki, sqlite_url):
    """mTLS, configured through the environment (EFFECT_LEDGER_TLS_*) rather than flags."""
    env = {
        "EFFECT_LEDGER_TLS_CERT": pki.path("server.pem"),
        "EFFECT_LEDGER_TLS_KEY": pki.path("server-key.pem"),
        "EFFECT_LEDGER_TLS_CLIENT_CA": pki.path("ca.pem"),
    }
    running = TlsServerProcess(sqlite_url, env=env, channel_credentials=credentials(pki, "client")).start()
    yield running
    running.stop()


def serve(database_url: str, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``effect-ledger serve`` that is expected to refuse its configuration and exit."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("EFFECT_LEDGER_")}
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", "serve", "--database-url", database_url, "--workers", "1", *arguments],
        env={**clean, **(env or {})},
        check=False,
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT_SECONDS,
    )


def assert_refused(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode != 0, f"the server started:\n{result.stderr}"
    for phrase in phrases:
        assert phrase in result.stderr, f"{phrase!r} not in:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


# --- TLS -----------------------------------------------------------------------------------------


def test_a_tls_server_answers_a_tls_client(pki, tls_server, sqlite_url):
    assert health_status(tls_server.target, credentials(pki)) == SERVING
    tenant = new_tenant(sqlite_url)
    with LedgerClient(tls_server.target, tenant.tokens["agent"], root_certificates=pki.read("ca.pem")) as agent:
        assert agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    assert "(TLS)" in tls_server.log()


def test_the_client_takes_its_ca_as_a_path_and_checks_the_servers_name(pki, tls_server, sqlite_url):
    tenant = new_tenant(sqlite_url)
    target = f"localhost:{tls_server.port}"  # the certificate names localhost as well
    with LedgerClient(target, tenant.tokens["agent"], root_certificates=pki.path("ca.pem")) as agent:
        run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        assert agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).run_id == run_id


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server, sqlite_url):
    assert refused_code(tls_server.target, None) == grpc.StatusCode.UNAVAILABLE
    tenant = new_tenant(sqlite_url)
    with LedgerClient(tls_server.target, tenant.tokens["agent"]) as agent, raises_error("UNAVAILABLE"):
        agent.runs.CreateRun(runs_pb2.CreateRunRequest())


def test_a_client_that_does_not_trust_the_servers_ca_is_refused(pki, tls_server):
    assert refused_code(tls_server.target, credentials(pki, ca="other-ca")) == grpc.StatusCode.UNAVAILABLE


def test_the_client_refuses_half_of_a_client_certificate(pki):
    with pytest.raises(ValueError, match="come together"):
        LedgerClient(
            "127.0.0.1:1", "token", root_certificates=pki.read("ca.pem"), client_certificate=pki.read("client.pem")
        )


# --- mTLS ----------------------------------------------------------------------------------------


def test_mtls_refuses_a_client_without_a_certificate(pki, mtls_server):
    assert refused_code(mtls_server.target, credentials(pki)) == grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_a_client_certificate_from_another_ca(pki, mtls_server):
    assert refused_code(mtls_server.target, credentials(pki, "rogue")) == grpc.StatusCode.UNAVAILABLE


def test_mtls_answers_a_client_certificate_from_its_ca(pki, mtls_server, sqlite_url):
    assert health_status(mtls_server.target, credentials(pki, "client")) == SERVING
    tenant = new_tenant(sqlite_url)
    agent = LedgerClient(
        mtls_server.target,
        tenant.tokens["agent"],
        root_certificates=pki.path("ca.pem"),
        client_certificate=pki.path("client.pem"),
        client_key=pki.path("client-key.pem"),
    )
    with agent:
        assert agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    assert "(mTLS: client certificates required)" in mtls_server.log()


def test_a_token_bound_to_a_certificate_works_from_that_certificate_only(pki, mtls_server, sqlite_url):
    """`effect-ledger principal bind`: the token alone is no longer enough."""
    tenant = new_tenant(sqlite_url)
    plaintext = ServerProcess(sqlite_url).start()

    def bind(*arguments: str) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "effect_ledger",
                "principal",
                "bind",
                "--database-url",
                sqlite_url,
                "--tenant",
                tenant.name,
                "--id",
                "agent",
                *arguments,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def create_run(target: str, certificate: str | None) -> str:
        tls = {}
        if certificate is not None:
            tls = {
                "root_certificates": pki.path("ca.pem"),
                "client_certificate": pki.path(f"{certificate}.pem"),
                "client_key": pki.path(f"{certificate}-key.pem"),
            }
        with LedgerClient(target, tenant.tokens["agent"], **tls) as agent:
            try:
                return agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
            except Exception as error:  # the client raises the service's own error classes
                return getattr(error, "reason", repr(error))

    try:
        bind("--subject", pki.client_subject)
        assert create_run(mtls_server.target, "client").startswith("run")
        assert create_run(mtls_server.target, "sibling") == "CLIENT_CERTIFICATE_MISMATCH"
        assert create_run(plaintext.target, None) == "CLIENT_CERTIFICATE_MISMATCH"  # no certificate at all
        bind("--clear")
        assert create_run(mtls_server.target, "sibling").startswith("run")
        assert create_run(plaintext.target, None).startswith("run")
    finally:
        plaintext.stop()


# --- workers -------------------------------------------------------------------------------------


def test_every_worker_serves_tls(pki, sqlite_url):
    """Connections spread over both workers (SO_REUSEPORT); every one speaks TLS only."""
    running = TlsServerProcess(sqlite_url, tls_flags(pki), workers=2, channel_credentials=credentials(pki)).start()
    try:
        for _ in range(16):
            assert health_status(running.target, credentials(pki)) == SERVING
            assert refused_code(running.target, None) == grpc.StatusCode.UNAVAILABLE
        log = running.log_path.read_text(errors="replace")
        assert log.count(f"serving on {running.target} (TLS)") == 2  # each worker, as it started
    finally:
        running.stop()


# --- refusals at start ---------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0"])
def test_plaintext_on_a_non_loopback_address_is_refused(sqlite_url, listen):
    assert_refused(serve(sqlite_url, "--listen", listen), "refusing plaintext", "--insecure")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_insecure_allows_plaintext_on_every_interface_and_warns_once(sqlite_url, how):
    arguments = ["--listen", "0.0.0.0:0", *(["--insecure"] if how == "flag" else [])]
    env = {"EFFECT_LEDGER_INSECURE": "1"} if how == "environment" else {}
    running = ServerProcess(sqlite_url, arguments, env=env, workers=2).start()
    try:
        assert running.health() == SERVING  # 127.0.0.1 is one of every interface
        assert running.log().count("WARNING effect_ledger.cli --insecure: serving plaintext on 0.0.0.0:0") == 1
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("flags", "phrase"),
    [
        (["--tls-cert", "server.pem"], "--tls-cert and --tls-key come together"),
        (["--tls-key", "server-key.pem"], "--tls-cert and --tls-key come together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
    ],
)
def test_half_a_tls_configuration_is_refused(pki, sqlite_url, flags, phrase):
    flags = [flags[0], pki.path(flags[1])]
    assert_refused(serve(sqlite_url, "--listen", "127.0.0.1:0", *flags), phrase)


def test_a_certificate_without_a_key_from_the_environment_is_refused(pki, sqlite_url):
    result = serve(sqlite_url, "--listen", "127.0.0.1:0", env={"EFFECT_LEDGER_TLS_CERT": pki.path("server.pem")})
    assert_refused(result, "--tls-cert and --tls-key come together")


@pytest.mark.parametrize(
    ("certificate", "key", "client_ca", "phrase"),
    [
        ("missing.pem", "server-key.pem", None, "--tls-cert {folder}/missing.pem: cannot read it"),
        ("server-key.pem", "server-key.pem", None, "not a PEM certificate"),
        ("server.pem", "server.pem", None, "--tls-key {folder}/server.pem: not a PEM private key"),
        ("server.pem", "client-key.pem", None, "not the key of the first certificate in --tls-cert"),
        (
            "server.pem",
            "server-key.pem",
            "client-key.pem",
            "--tls-client-ca {folder}/client-key.pem: not a PEM certificate",
        ),
    ],
)
def test_an_unusable_tls_file_is_refused_with_its_name(pki, sqlite_url, certificate, key, client_ca, phrase):
    flags = ["--tls-cert", pki.path(certificate), "--tls-key", pki.path(key)]
    if client_ca:
        flags += ["--tls-client-ca", pki.path(client_ca)]
    assert_refused(serve(sqlite_url, "--listen", "127.0.0.1:0", *flags), phrase.format(folder=pki.folder))


def test_an_encrypted_key_is_refused(pki, sqlite_url, tmp_path):
    key = serialization.load_pem_private_key(pki.read("server-key.pem"), password=None)
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    flags = ["--tls-cert", pki.path("server.pem"), "--tls-key", str(encrypted)]
    assert_refused(serve(sqlite_url, "--listen", "127.0.0.1:0", *flags), "encrypted; give the key without a passphrase")


def test_a_bad_tls_file_stops_a_supervisor_and_its_workers(pki, sqlite_url):
    flags = ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("client-key.pem")]
    result = serve(sqlite_url, "--listen", "127.0.0.1:0", *flags, "--workers", "2")
    assert_refused(result, "not the key of the first certificate in --tls-cert", "exited with status 1 before serving")


# --- the client certificate's subject (transport/peer.py) --------------------------------------

ECHO_METHOD = "/effectledger.test.Peer/Echo"


async def _echo_identity(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return json.dumps({"subject": client_subject(context), "common_name": client_common_name(context)}).encode()


async def identity_seen_by_server(settings: ServerSettings, channel_credentials) -> dict:
    """Start a grpc.aio server with ``settings``' TLS (the server's own loader), make one call
    and return what client_subject and client_common_name saw."""
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(_echo_identity)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("effectledger.test.Peer", {"Echo": handler})])
    server_tls = server_credentials(settings)
    if server_tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", server_tls)
    await server.start()
    try:
        target = f"127.0.0.1:{port}"
        if channel_credentials is None:
            channel = grpc.aio.insecure_channel(target)
        else:
            channel = grpc.aio.secure_channel(target, channel_credentials)
        async with channel:
            answer = await channel.unary_unary(ECHO_METHOD)(b"", timeout=CALL_TIMEOUT_SECONDS)
        return json.loads(answer)
    finally:
        await server.stop(0)


async def test_client_subject_is_the_verified_client_certificates_subject(pki):
    settings = ServerSettings(
        tls_certificate=pki.path("server.pem"), tls_key=pki.path("server-key.pem"), tls_client_ca=pki.path("ca.pem")
    )
    seen = await identity_seen_by_server(settings, credentials(pki, "client"))
    assert seen == {"subject": pki.client_subject, "common_name": CLIENT_COMMON_NAME}
    assert pki.client_subject == f"CN={CLIENT_COMMON_NAME},O=Example\\, Inc"


async def test_client_subject_is_none_without_a_client_certificate(pki):
    tls_only = ServerSettings(tls_certificate=pki.path("server.pem"), tls_key=pki.path("server-key.pem"))
    assert await identity_seen_by_server(tls_only, credentials(pki, "client")) == {"subject": None, "common_name": None}
    assert await identity_seen_by_server(ServerSettings(), None) == {"subject": None, "common_name": None}
