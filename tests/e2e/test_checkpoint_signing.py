"""Signed checkpoint archives, on PostgreSQL and on SQLite.

A server started with ``--checkpoint-signing-key`` and ``--checkpoint-verification-key`` signs
the manifest of every export (``manifest.sig``: Ed25519 over the manifest's exact bytes) and
refuses any import whose manifest its key does not verify, before writing anything.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e.test_checkpoint_archives import (
    EXPECTED_FILES,
    assert_refused,
    checkpoint_ids,
    export,
    flip,
    import_archive,
    read_members,
    sha256,
    tar_files,
    with_manifest,
)
from support import ServerProcess, checkpoints_stub, new_run, new_tenant

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import SIGNATURE_FILE
from effectledger.v1 import checkpoints_pb2, runs_pb2


def write_key_pair(folder: Path, name: str) -> tuple[Ed25519PrivateKey, Path, Path]:
    key = Ed25519PrivateKey.generate()
    private_path, public_path = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return key, private_path, public_path


@pytest.fixture(scope="module")
def keys():
    folder = Path(tempfile.mkdtemp(prefix="el-keys-"))
    key, private_path, public_path = write_key_pair(folder, "signing")
    other, _, _ = write_key_pair(folder, "other")
    return {"key": key, "private": private_path, "public": public_path, "other": other}


@pytest.fixture(scope="module")
def signing_server(database_url, keys):
    """A second server on the session database that signs exports and verifies imports."""
    running = ServerProcess(
        database_url,
        ["--checkpoint-signing-key", str(keys["private"]), "--checkpoint-verification-key", str(keys["public"])],
    ).start()
    yield running
    running.stop()


class Signed:
    """A tenant with one run and two sealed checkpoints of it, exported by the signing server."""

    def __init__(self, signing_server, plain_server, database_url) -> None:
        self.tenant = new_tenant(database_url)
        self.agent = self.tenant.client(signing_server, "agent")
        self.stub = checkpoints_stub(signing_server, self.tenant.tokens["agent"])
        self.plain_stub = checkpoints_stub(plain_server, self.tenant.tokens["agent"])
        self.run_id = new_run(self.agent)
        self.first = self.seal(b'{"step":1}')
        self.second = self.seal(b'{"step":2}')
        self.archive = export(self.stub, self.first.checkpoint_id)
        self.other_archive = export(self.stub, self.second.checkpoint_id)

    def seal(self, state: bytes) -> checkpoints_pb2.Checkpoint:
        revision = self.agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=self.run_id)).revision
        return self.stub.SealCheckpoint(
            checkpoints_pb2.SealCheckpointRequest(run_id=self.run_id, expected_revision=revision, state_json=state)
        )

    @property
    def files(self) -> dict[str, bytes]:
        return read_members(self.archive)

    def refused(self, data: bytes, code: str, component: str) -> None:
        assert_refused(self.stub, self.agent.runs, self.run_id, data, code, component)


@pytest.fixture(scope="module")
def signed(signing_server, server, database_url) -> Signed:
    return Signed(signing_server, server, database_url)


def test_an_export_carries_a_signature_of_its_manifest_and_imports(signed, keys):
    files = signed.files
    assert set(files) == EXPECTED_FILES | {SIGNATURE_FILE}
    manifest = files["manifest.json"]
    assert canonical_bytes(json.loads(manifest)) == manifest
    # Not listed in the manifest (it signs the manifest), and it verifies against the public key.
    assert SIGNATURE_FILE not in json.loads(manifest)["files"]
    keys["key"].public_key().verify(files[SIGNATURE_FILE], manifest)

    before = checkpoint_ids(signed.stub, signed.run_id)
    imported = import_archive(signed.stub, signed.archive)
    assert imported.run_id == signed.run_id and imported.format_version == 2
    assert imported.imported_from_digest and imported.checkpoint_id not in before
    assert imported.state_json == signed.first.state_json
    assert checkpoint_ids(signed.stub, signed.run_id) == sorted(before + [imported.checkpoint_id])


def test_the_plain_server_exports_unsigned_archives(signed):
    """The control for the unsigned case: the same checkpoint through the server without keys."""
    plain = export(signed.plain_stub, signed.first.checkpoint_id)
    plain_files = read_members(plain)
    assert set(plain_files) == EXPECTED_FILES
    assert plain_files["manifest.json"] == signed.files["manifest.json"]
    signed.refused(plain, "FAILED_PRECONDITION", SIGNATURE_FILE)


def test_an_unsigned_archive_is_refused(signed):
    files = signed.files
    del files[SIGNATURE_FILE]
    signed.refused(tar_files(files), "FAILED_PRECONDITION", SIGNATURE_FILE)


def test_a_signature_from_another_key_is_refused(signed, keys):
    files = signed.files
    files[SIGNATURE_FILE] = keys["other"].sign(files["manifest.json"])
    signed.refused(tar_files(files), "INVALID_ARGUMENT", SIGNATURE_FILE)


def test_a_swapped_signature_is_refused(signed, keys):
    """A valid signature, by the configured key, of another archive's manifest."""
    other = read_members(signed.other_archive)
    keys["key"].public_key().verify(other[SIGNATURE_FILE], other["manifest.json"])
    files = signed.files
    assert other[SIGNATURE_FILE] != files[SIGNATURE_FILE]
    files[SIGNATURE_FILE] = other[SIGNATURE_FILE]
    signed.refused(tar_files(files), "INVALID_ARGUMENT", SIGNATURE_FILE)


def test_a_malformed_signature_is_refused(signed):
    for garbage in (b"", b"\0" * 64, flip(signed.files[SIGNATURE_FILE], 0), b"not a signature"):
        files = signed.files
        files[SIGNATURE_FILE] = garbage
        signed.refused(tar_files(files), "INVALID_ARGUMENT", SIGNATURE_FILE)


def test_a_modified_manifest_with_the_original_signature_is_refused(signed, keys):
    # A field no file digest covers.
    changed = with_manifest(signed.files, lambda m: m.__setitem__("sealed_at", "2000-01-01T00:00:00.000000Z"))
    signed.refused(tar_files(changed), "INVALID_ARGUMENT", SIGNATURE_FILE)
    changed = with_manifest(signed.files, lambda m: m.__setitem__("revision", m["revision"] + 1))
    signed.refused(tar_files(changed), "INVALID_ARGUMENT", SIGNATURE_FILE)

    # A consistent forgery: new state, its file digest and its content digest all updated. Only
    # the signature can tell, and it does.
    forged_state = b'{"step":99}'

    def forge(manifest):
        manifest["files"]["state.json"] = sha256(forged_state)
        manifest["state_digest"] = sha256(canonical_bytes(json.loads(forged_state)))

    forged = with_manifest({**signed.files, "state.json": forged_state}, forge)
    signed.refused(tar_files(forged), "INVALID_ARGUMENT", SIGNATURE_FILE)
    # The same forgery without the signature is refused as unsigned; re-signed by the wrong key, too.
    unsigned = {k: v for k, v in forged.items() if k != SIGNATURE_FILE}
    signed.refused(tar_files(unsigned), "FAILED_PRECONDITION", SIGNATURE_FILE)
    resigned = {**forged, SIGNATURE_FILE: keys["other"].sign(forged["manifest.json"])}
    signed.refused(tar_files(resigned), "INVALID_ARGUMENT", SIGNATURE_FILE)


def test_a_tampered_file_beside_a_valid_signature_is_refused(signed):
    files = signed.files
    files["ledger/effects.json"] = flip(files["ledger/effects.json"])
    signed.refused(tar_files(files), "INVALID_ARGUMENT", "ledger/effects.json")
