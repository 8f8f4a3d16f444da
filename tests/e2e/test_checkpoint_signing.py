"""Signed checkpoint archives, on PostgreSQL and on SQLite.

Every export carries ``manifest.sig``: Ed25519 over the manifest's exact bytes, by the
deployment's own key (generated at the first start and kept in the database) or by the key
given with ``--checkpoint-signing-key``. An import is accepted when a key the deployment trusts
signed it (its own keys, retired ones included, keys it was told to trust, and
``--checkpoint-verification-key``). Anything else is refused before anything is written, unless
an admin asks for it explicitly (``allow_unsigned``), and then only as a new run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from e2e.test_checkpoint_archives import (
    EXPECTED_FILES,
    _consistent,
    assert_refused,
    checkpoint_ids,
    export,
    flip,
    import_archive,
    read_members,
    seal_and_export,
    sha256,
    tar_files,
    with_manifest,
)
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import SIGNATURE_FILE
from effectledger.v1 import checkpoints_pb2, runs_pb2
from support import ServerProcess, checkpoints_stub, new_run, new_tenant, raises_error


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

    def refused(self, data: bytes, code: str, component: str, reason: str = "") -> None:
        assert_refused(self.stub, self.agent.runs, self.run_id, data, code, component, reason=reason)


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


def deployment_public_key(database_url: str) -> Ed25519PublicKey:
    """The key that signs the default server's exports, as the operator's CLI prints it."""
    from effect_ledger.cli import checkpoint_keys

    key = serialization.load_pem_public_key(checkpoint_keys(database_url, "export-public")[0]["public_key"].encode())
    assert isinstance(key, Ed25519PublicKey)
    return key


def test_the_default_server_signs_with_the_deployment_key(signed, database_url):
    """The server without key options signs too, with the key it generated at its first start;
    the other server on the same database trusts that key (it is in the database)."""
    plain = export(signed.plain_stub, signed.first.checkpoint_id)
    plain_files = read_members(plain)
    assert set(plain_files) == EXPECTED_FILES | {SIGNATURE_FILE}
    assert plain_files["manifest.json"] == signed.files["manifest.json"]
    deployment_public_key(database_url).verify(plain_files[SIGNATURE_FILE], plain_files["manifest.json"])
    assert plain_files[SIGNATURE_FILE] != signed.files[SIGNATURE_FILE]  # not the configured key
    assert import_archive(signed.stub, plain).run_id == signed.run_id


def test_an_unsigned_archive_is_refused(signed):
    files = signed.files
    del files[SIGNATURE_FILE]
    signed.refused(tar_files(files), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_UNSIGNED")


def test_a_signature_from_another_key_is_refused(signed, keys):
    files = signed.files
    files[SIGNATURE_FILE] = keys["other"].sign(files["manifest.json"])
    signed.refused(tar_files(files), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")


def test_a_swapped_signature_is_refused(signed, keys):
    """A valid signature, by the configured key, of another archive's manifest."""
    other = read_members(signed.other_archive)
    keys["key"].public_key().verify(other[SIGNATURE_FILE], other["manifest.json"])
    files = signed.files
    assert other[SIGNATURE_FILE] != files[SIGNATURE_FILE]
    files[SIGNATURE_FILE] = other[SIGNATURE_FILE]
    signed.refused(tar_files(files), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")


def test_a_malformed_signature_is_refused(signed):
    for garbage in (b"", b"\0" * 64, flip(signed.files[SIGNATURE_FILE], 0), b"not a signature"):
        files = signed.files
        files[SIGNATURE_FILE] = garbage
        signed.refused(tar_files(files), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")


def test_a_modified_manifest_with_the_original_signature_is_refused(signed, keys):
    # A field no file digest covers.
    changed = with_manifest(signed.files, lambda m: m.__setitem__("sealed_at", "2000-01-01T00:00:00.000000Z"))
    signed.refused(tar_files(changed), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")
    changed = with_manifest(signed.files, lambda m: m.__setitem__("revision", m["revision"] + 1))
    signed.refused(tar_files(changed), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")

    # A consistent forgery: new state, its file digest and its content digest all updated. Only
    # the signature can tell, and it does.
    forged_state = b'{"step":99}'

    def forge(manifest):
        manifest["files"]["state.json"] = sha256(forged_state)
        manifest["state_digest"] = sha256(canonical_bytes(json.loads(forged_state)))

    forged = with_manifest({**signed.files, "state.json": forged_state}, forge)
    signed.refused(tar_files(forged), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")
    # The same forgery without the signature is refused as unsigned; re-signed by the wrong key, too.
    unsigned = {k: v for k, v in forged.items() if k != SIGNATURE_FILE}
    signed.refused(tar_files(unsigned), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_UNSIGNED")
    resigned = {**forged, SIGNATURE_FILE: keys["other"].sign(forged["manifest.json"])}
    signed.refused(tar_files(resigned), "FAILED_PRECONDITION", SIGNATURE_FILE, "CHECKPOINT_SIGNER_UNKNOWN")


def test_a_planted_archive_is_refused_and_an_admin_may_only_import_it_as_a_new_run(server, database_url):
    """The forgery of the report, on the default server: an agent rewrites an exported archive's
    revision and makes everything derivable agree. Unsigned, it is refused to the agent, with or
    without allow_unsigned; an admin who asks for it explicitly cannot attach it to the existing
    run either; only as a new run, whose trace records that no trusted key signed it."""
    exported = seal_and_export(server, new_tenant(database_url))
    forged = tar_files(_consistent(exported.files, lambda m: m.__setitem__("revision", m["revision"] + 2)))
    runs = exported.agent.runs
    assert_refused(
        exported.stub,
        runs,
        exported.run_id,
        forged,
        "FAILED_PRECONDITION",
        SIGNATURE_FILE,
        reason="CHECKPOINT_UNSIGNED",
    )
    with raises_error("PERMISSION_DENIED", "UNSIGNED_IMPORT_NEEDS_ADMIN"):
        import_archive(exported.stub, forged, allow_unsigned=True)
    before = checkpoint_ids(exported.stub, exported.run_id)
    with raises_error("FAILED_PRECONDITION", "UNSIGNED_IMPORT_INTO_EXISTING_RUN"):
        import_archive(exported.admin_stub, forged, allow_unsigned=True)
    assert checkpoint_ids(exported.stub, exported.run_id) == before

    fresh_run = "run_planted_" + exported.run_id[-12:]
    as_new_run = tar_files(
        _consistent(exported.files, lambda m: m.update(run_id=fresh_run, revision=m["revision"] + 2))
    )
    imported = import_archive(exported.admin_stub, as_new_run, allow_unsigned=True)
    assert imported.run_id == fresh_run and imported.revision == exported.checkpoint.revision + 2
    events = (
        exported.tenant.client(server, "admin")
        .runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=fresh_run))
        .events
    )
    created = [json.loads(e.payload_json) for e in events if e.type == "run.imported"]
    assert created and created[0]["signed_by"] == ""
    # The genuine archive still imports for the agent, into its own run, signed by the deployment.
    assert import_archive(exported.stub, exported.archive).run_id == exported.run_id


def test_a_tampered_file_beside_a_valid_signature_is_refused(signed):
    files = signed.files
    files["ledger/effects.json"] = flip(files["ledger/effects.json"])
    signed.refused(tar_files(files), "INVALID_ARGUMENT", "ledger/effects.json")
