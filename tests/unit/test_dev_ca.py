"""deploy/dev-ca.sh makes certificates a deployment can use: run in a folder of its own, its
outputs are loaded with ``cryptography`` and checked against the names deploy/compose.yaml and
deploy/k8s connect to.

The script writes next to itself (``<its folder>/certs``), so it runs from a copy in a temporary
folder and the repository's deploy/ is never touched. It needs ``openssl``: without it the test
fails, saying so (the Debian base of CI and of the image has it).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCRIPT_TIMEOUT_SECONDS = 60


def _environment_of(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def names_connected_to() -> set[str]:
    """Every name or address a client of the deployments reaches the server by."""
    names = set()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service = compose["services"]["effect-ledger"]
    names.add("effect-ledger")  # the compose service's name, for the other containers
    for published in service.get("ports", []):
        names.add(str(published).split(":")[0])  # the host address the port is published on
    # The image's health check connects to 127.0.0.1 and expects this name (localhost by default).
    health_name = (service.get("environment") or {}).get("HEALTHCHECK_TLS_SERVER_NAME") or "localhost"
    names.add(health_name)
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            if document.get("kind") == "Service":
                names.add(document["metadata"]["name"])
            if document.get("kind") == "Deployment":
                for container in document["spec"]["template"]["spec"]["containers"]:
                    environment = _environment_of(container)
                    if "HEALTHCHECK_TLS_SERVER_NAME" in environment:
                        names.add(environment["HEALTHCHECK_TLS_SERVER_NAME"])
    return names


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    openssl = shutil.which("openssl")
    assert openssl is not None, "deploy/dev-ca.sh needs openssl on PATH (apt-get install openssl)"
    folder = tmp_path_factory.mktemp("dev-ca")
    script = folder / "dev-ca.sh"
    shutil.copy2(DEPLOY / "dev-ca.sh", script)
    finished = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_SECONDS, check=False
    )
    assert finished.returncode == 0, f"dev-ca.sh failed:\n{finished.stdout}\n{finished.stderr}"
    again = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_SECONDS, check=False
    )
    assert again.returncode != 0 and "exists" in again.stderr, "dev-ca.sh overwrote its certificates"
    return folder / "certs"


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def key_matches(certificate: x509.Certificate, key_path: Path) -> bool:
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    return key.public_key().public_numbers() == certificate.public_key().public_numbers()


def assert_issued_now(certificate: x509.Certificate, ca: x509.Certificate) -> None:
    certificate.verify_directly_issued_by(ca)  # raises unless the CA's key signed it
    now = datetime.datetime.now(datetime.UTC)
    assert certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is False


def usages(certificate: x509.Certificate) -> set:
    return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_the_ca_is_a_ca_and_its_key_is_private(certs):
    ca = load(certs / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.issuer == ca.subject
    ca.verify_directly_issued_by(ca)
    assert key_matches(ca, certs / "ca-key.pem")
    assert (certs / "ca-key.pem").stat().st_mode & 0o077 == 0
    assert not (certs / "server" / "ca-key.pem").exists(), "the CA's key is in what the server mounts"
    assert (certs / "server" / "ca.pem").read_bytes() == (certs / "ca.pem").read_bytes()


def test_the_server_certificate_is_signed_by_the_ca_and_names_what_clients_connect_to(certs):
    ca = load(certs / "ca.pem")
    server = load(certs / "server" / "server.pem")
    assert_issued_now(server, ca)
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey)
    assert key_matches(server, certs / "server" / "server-key.pem")
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages(server)
    alternative = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = set(alternative.get_values_for_type(x509.DNSName))
    named |= {str(address) for address in alternative.get_values_for_type(x509.IPAddress)}
    wanted = names_connected_to()
    assert {"effect-ledger", "localhost", "127.0.0.1"} <= wanted  # the manifests were read
    assert wanted <= named, f"names the deployments connect to but the certificate lacks: {wanted - named}"
    assert ipaddress.ip_address("::1") in alternative.get_values_for_type(x509.IPAddress)


@pytest.mark.parametrize(
    ("certificate", "key", "common_name"),
    [
        ("client.pem", "client-key.pem", "dev-client"),
        ("server/healthcheck.pem", "server/healthcheck-key.pem", "effect-ledger-healthcheck"),
    ],
)
def test_client_certificates_are_signed_by_the_ca_for_client_auth_only(certs, certificate, key, common_name):
    ca = load(certs / "ca.pem")
    client = load(certs / certificate)
    assert_issued_now(client, ca)
    assert key_matches(client, certs / key)
    assert usages(client) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == common_name
