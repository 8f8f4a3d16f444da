"""Checkpoint signing keys: Ed25519 key pairs, their ids, signing and verifying manifests.

A key's id is the SHA-256 of its raw 32-byte public key, in hex. A manifest signature
(``manifest.sig`` in an archive) is Ed25519 over the manifest's exact bytes; it names no key,
so an importer tries each key it trusts (a bounded list).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from effect_ledger.errors import InvalidArgument

# An importer tries at most this many keys (own keys, rotated ones, trusted keys of others).
TRUSTED_KEYS_MAX = 64


@dataclass(frozen=True)
class KeyPair:
    key_id: str
    public_pem: str
    private_pem: str


def key_id_of(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def _public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(
        "ascii"
    )


def generate() -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")
    return KeyPair(key_id_of(key.public_key()), _public_pem(key.public_key()), private_pem)


def private_key(pem: str | bytes, *, source: str = "private key") -> KeyPair:
    """An Ed25519 private key (PEM, unencrypted), as a key pair; anything else is refused."""
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise InvalidArgument.field(source, f"is not a PEM private key: {error}", reason="KEY_INVALID") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidArgument.field(source, "is not an Ed25519 private key", reason="KEY_INVALID")
    return KeyPair(key_id_of(key.public_key()), _public_pem(key.public_key()), data.decode("ascii"))


def public_key(pem: str | bytes, *, source: str = "public key") -> tuple[str, str]:
    """An Ed25519 public key (PEM): its id and its canonical PEM text."""
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as error:
        raise InvalidArgument.field(source, f"is not a PEM public key: {error}", reason="KEY_INVALID") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidArgument.field(source, "is not an Ed25519 public key", reason="KEY_INVALID")
    return key_id_of(key), _public_pem(key)


def sign(private_pem: str, message: bytes) -> bytes:
    key = serialization.load_pem_private_key(private_pem.encode("ascii"), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key.sign(message)


def signer_of(trusted_public_pems: dict[str, str], message: bytes, signature: bytes | None) -> str | None:
    """The id of the trusted key whose signature ``signature`` is, or None (unsigned, or no
    trusted key verifies it)."""
    if signature is None:
        return None
    for key_id, pem in sorted(trusted_public_pems.items())[:TRUSTED_KEYS_MAX]:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
        assert isinstance(key, Ed25519PublicKey)
        try:
            key.verify(signature, message)
        except InvalidSignature:
            continue
        return key_id
    return None
