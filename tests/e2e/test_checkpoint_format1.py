"""Importing an archive of the first format, on PostgreSQL and on SQLite.

The committed fixture ``tests/fixtures/checkpoint-format1.tar`` (written by
``make_checkpoint_format1.py`` next to it) belongs to the tenant "fixture-tenant". Importing it
keeps the original (format 1, as stored) and derives a current-format checkpoint from it; what
format 1 did not record (budgets, approval quorum) becomes unknown, never a default.

The fixture is unsigned, as archives of the first format were. The tests sign it with a key of
an "older deployment" that the test database is told to trust (``checkpoint-keys trust``), the
way an operator carries archives over; the refusal of unsigned archives is shown in
test_checkpoint_signing.py. The test databases live for the whole pytest session, so the run the
fixture names may already exist when a test imports it: the import attaches to it.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from e2e.test_checkpoint_archives import (
    checkpoint_ids,
    export,
    import_archive,
    read_members,
    tar_files,
)
from effect_ledger.client import LedgerClient
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import SIGNATURE_FILE
from effectledger.v1 import checkpoints_pb2, runs_pb2
from support import REPO, Tenant, checkpoints_stub, new_tenant, raises_error

FIXTURE_DIR = REPO / "tests" / "fixtures"
FIXTURE = FIXTURE_DIR / "checkpoint-format1.tar"
UNKNOWN = {"status": "unknown"}


def _script():
    spec = importlib.util.spec_from_file_location("make_checkpoint_format1", FIXTURE_DIR / "make_checkpoint_format1.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


script = _script()


@pytest.fixture(scope="module")
def older_deployment_key(database_url, tmp_path_factory) -> Ed25519PrivateKey:
    """A key of the deployment that wrote the fixture, trusted by the test database."""
    from effect_ledger.cli import checkpoint_keys

    key = Ed25519PrivateKey.generate()
    public = tmp_path_factory.mktemp("older-deployment") / "older.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    checkpoint_keys(database_url, "trust", str(public), "the deployment that wrote format-1 archives")
    return key


def signed_by(key: Ed25519PrivateKey, data: bytes) -> bytes:
    """The archive with manifest.sig added: the key's signature of its manifest."""
    files = read_members(data)
    files[SIGNATURE_FILE] = key.sign(files["manifest.json"])
    return tar_files(files)


@pytest.fixture(scope="module")
def fixture_bytes(older_deployment_key) -> bytes:
    return signed_by(older_deployment_key, FIXTURE.read_bytes())


@pytest.fixture
def fixture_tenant(database_url) -> Tenant:
    """The tenant the fixture's manifest names. It outlives a test (the database does), so each
    test adds principals of its own to it."""
    tenant = Tenant(database_url, script.TENANT)
    tenant.tokens["agent"] = tenant.add(f"agent-{uuid.uuid4().hex[:8]}", "agent")
    return tenant


class Imported:
    def __init__(self, server, tenant: Tenant, data: bytes) -> None:
        self.stub = checkpoints_stub(server, tenant.tokens["agent"])
        self.runs = LedgerClient(server.target, tenant.tokens["agent"]).runs
        self.derived = import_archive(self.stub, data)
        self.original = self.stub.GetCheckpoint(
            checkpoints_pb2.GetCheckpointRequest(checkpoint_id=self.derived.derived_from)
        )

    def events(self, event_type: str) -> list:
        found, after = [], 0
        while True:
            page = self.runs.ListRunEvents(
                runs_pb2.ListRunEventsRequest(run_id=script.RUN_ID, after_revision=after, page_size=1000)
            ).events
            found += [e for e in page if e.type == event_type]
            if not page:
                return found
            after = page[-1].revision


def fixture_files(data: bytes) -> dict[str, bytes]:
    return read_members(data)


def test_the_fixture_is_what_the_script_writes():
    fixture_bytes = FIXTURE.read_bytes()
    assert script.build() == fixture_bytes, "run tests/fixtures/make_checkpoint_format1.py"
    files = fixture_files(fixture_bytes)
    assert set(files) == {
        "manifest.json",
        "state.json",
        "artifacts.json",
        "README.md",
        "ledger/effects.json",
        "ledger/approvals.json",
        "ledger/tools.json",
        "ledger/policy.json",
    }
    manifest = json.loads(files["manifest.json"])
    assert canonical_bytes(manifest) == files["manifest.json"]
    assert manifest["format_version"] == 1 and manifest["tenant_id"] == "fixture-tenant"
    assert manifest["run_id"] == script.RUN_ID and "budgets" not in manifest["sections"]
    effects = json.loads(files["ledger/effects.json"])
    assert all("state" in e and "stage" not in e for e in effects["open"])
    approvals = json.loads(files["ledger/approvals.json"])
    assert all("quorum" not in a for group in approvals.values() for a in group)
    with tarfile.open(fileobj=io.BytesIO(fixture_bytes)) as archive:
        assert all(m.isreg() and m.mtime == 0 and m.uid == 0 for m in archive.getmembers())


def test_import_keeps_the_original_and_derives_a_current_checkpoint(server, fixture_tenant, fixture_bytes):
    files = fixture_files(fixture_bytes)
    imported = Imported(server, fixture_tenant, fixture_bytes)
    derived, original = imported.derived, imported.original

    # The response is the derived checkpoint, of the current format, naming its original.
    assert derived.format_version == 2 and derived.derived_from == original.checkpoint_id
    assert derived.checkpoint_id != original.checkpoint_id
    assert derived.run_id == original.run_id == script.RUN_ID
    assert derived.revision == original.revision == script.REVISION
    assert checkpoints_pb2.CheckpointStatus.Name(derived.status) == "SEALED"
    assert derived.imported_from_digest and derived.imported_from_digest == original.imported_from_digest
    assert derived.policy_revision == original.policy_revision == script.POLICY_REVISION
    assert json.loads(derived.state_json) == json.loads(original.state_json) == script.STATE

    # The original is kept as stored: format 1, its ledger exactly the archive's sections.
    assert original.format_version == 1 and not original.derived_from
    assert checkpoints_pb2.CheckpointStatus.Name(original.status) == "SEALED"
    stored = json.loads(original.ledger_json)
    assert stored == {
        name: json.loads(files[f"ledger/{name}.json"]) for name in ("effects", "approvals", "tools", "policy")
    }
    assert stored == script.LEDGER
    manifest = json.loads(files["manifest.json"])
    assert json.loads(original.manifest_json) == {k: v for k, v in manifest.items() if k != "files"}
    assert [(a.name, a.digest) for a in original.artifacts] == [(a.name, a.digest) for a in script.ARTIFACTS]

    # Both are listed for the run.
    listed = checkpoint_ids(imported.stub, script.RUN_ID)
    assert original.checkpoint_id in listed and derived.checkpoint_id in listed

    # What format 1 did not record is unknown in the derived ledger, never a default.
    ledger = json.loads(derived.ledger_json)
    assert set(ledger) == {"effects", "approvals", "budgets", "tools", "policy"}
    assert ledger["budgets"]["status"] == "unknown" and "budgets" not in ledger["budgets"]
    approvals = [a for group in ("pending", "active", "denied") for a in ledger["approvals"][group]]
    assert {a["approval_id"] for a in approvals} == {script.PENDING_APPROVAL_ID, script.ACTIVE_APPROVAL_ID}
    for approval in approvals:
        assert approval["quorum"] == UNKNOWN, approval
    # The effects' "state" became "stage"; the unknown one is still UNKNOWN.
    open_effects = {e["effect_id"]: e for e in ledger["effects"]["open"]}
    assert {k: e["stage"] for k, e in open_effects.items()} == {
        script.UNKNOWN_EFFECT_ID: "UNKNOWN",
        script.DISPATCHED_EFFECT_ID: "DISPATCHED",
    }
    assert all("state" not in e for e in open_effects.values())
    assert ledger["effects"]["settled"] == []
    assert ledger["tools"] == script.LEDGER["tools"] and ledger["policy"] == script.LEDGER["policy"]

    # The derived manifest is of the current format and describes the derived ledger.
    derived_manifest = json.loads(derived.manifest_json)
    assert derived_manifest["format_version"] == 2 and derived_manifest["checkpoint_id"] == derived.checkpoint_id
    assert set(derived_manifest["sections"]) == {"effects", "approvals", "budgets", "tools", "policy"}

    # The migration is in the trace, with its notes.
    (migrated,) = [
        e
        for e in imported.events("checkpoint.migrated")
        if json.loads(e.payload_json)["checkpoint_id"] == derived.checkpoint_id
    ]
    payload = json.loads(migrated.payload_json)
    assert payload["derived_from"] == original.checkpoint_id
    assert (payload["from_format"], payload["to_format"]) == (1, 2)
    assert any(n.startswith("approvals:") and "quorum unknown" in n for n in payload["notes"]), payload["notes"]
    assert any(n.startswith("budgets:") and "unknown" in n for n in payload["notes"]), payload["notes"]
    (imported_event,) = [
        e
        for e in imported.events("checkpoint.imported")
        if json.loads(e.payload_json)["checkpoint_id"] == original.checkpoint_id
    ]
    assert json.loads(imported_event.payload_json)["format_version"] == 1


def test_the_unknown_effect_stays_unknown_after_migration(server, fixture_tenant, fixture_bytes):
    imported = Imported(server, fixture_tenant, fixture_bytes)
    derived = imported.derived
    # The ledger the resume would read says UNKNOWN, and a resume is refused until it is reconciled.
    verdict = imported.stub.CheckResumeCompatibility(
        checkpoints_pb2.CheckResumeCompatibilityRequest(checkpoint_id=derived.checkpoint_id)
    )
    assert checkpoints_pb2.Verdict.Name(verdict.verdict) == "INCOMPATIBLE"
    assert f"effect:{script.UNKNOWN_EFFECT_ID}" in {f.fact for f in verdict.facts}
    # The derived checkpoint's export says so to a person, too.
    files = read_members(export(imported.stub, derived.checkpoint_id))
    assert json.loads(files["manifest.json"])["format_version"] == 2
    assert json.loads(files["ledger/budgets.json"])["status"] == "unknown"
    unknown_part = files["README.md"].decode().split("## What is unknown", 1)[1].split("\n## ", 1)[0]
    assert script.UNKNOWN_EFFECT_ID in unknown_part and "may have happened" in unknown_part


def test_the_original_cannot_be_registered(server, fixture_tenant, fixture_bytes):
    imported = Imported(server, fixture_tenant, fixture_bytes)
    with raises_error("FAILED_PRECONDITION", "FORMAT_NOT_CURRENT"):
        imported.stub.RegisterCheckpoint(
            checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=imported.original.checkpoint_id)
        )
    assert [v.subject for v in raises_error.last.violations] == [f"checkpoint/{imported.original.checkpoint_id}"]
    again = imported.stub.GetCheckpoint(
        checkpoints_pb2.GetCheckpointRequest(checkpoint_id=imported.original.checkpoint_id)
    )
    assert checkpoints_pb2.CheckpointStatus.Name(again.status) == "SEALED" and again.format_version == 1


def test_importing_the_fixture_again_attaches_to_the_same_run(server, fixture_tenant, fixture_bytes):
    first = Imported(server, fixture_tenant, fixture_bytes)
    revision = first.runs.GetRun(runs_pb2.GetRunRequest(run_id=script.RUN_ID)).revision
    second = Imported(server, fixture_tenant, fixture_bytes)
    ids = {
        first.original.checkpoint_id,
        first.derived.checkpoint_id,
        second.original.checkpoint_id,
        second.derived.checkpoint_id,
    }
    assert len(ids) == 4 and ids <= set(checkpoint_ids(second.stub, script.RUN_ID))
    assert second.derived.run_id == first.derived.run_id == script.RUN_ID
    assert json.loads(second.derived.ledger_json) == json.loads(first.derived.ledger_json)
    # Two events (checkpoint.imported, checkpoint.migrated); no second run.imported.
    assert first.runs.GetRun(runs_pb2.GetRunRequest(run_id=script.RUN_ID)).revision == revision + 2
    assert len(second.events("run.imported")) == 1


def test_the_original_can_be_exported_and_imported_again(server, fixture_tenant, fixture_bytes):
    """A kept format-1 original exports as a format-1 archive, which imports like the fixture."""
    imported = Imported(server, fixture_tenant, fixture_bytes)
    data = export(imported.stub, imported.original.checkpoint_id)
    files = read_members(data)
    manifest = json.loads(files["manifest.json"])
    assert manifest["format_version"] == 1 and "budgets" not in manifest["sections"]
    assert "ledger/budgets.json" not in files
    unknown_part = files["README.md"].decode().split("## What is unknown", 1)[1].split("\n## ", 1)[0]
    assert script.UNKNOWN_EFFECT_ID in unknown_part and "may have happened" in unknown_part
    again = import_archive(imported.stub, data)
    assert again.format_version == 2 and again.derived_from
    assert json.loads(again.ledger_json) == json.loads(imported.derived.ledger_json)


def test_the_fixture_belongs_to_its_tenant_only(server, database_url, fixture_bytes):
    other = new_tenant(database_url)
    with raises_error("FAILED_PRECONDITION", "ARCHIVE_REFUSED"):
        import_archive(checkpoints_stub(server, other.tokens["agent"]), fixture_bytes)
    assert raises_error.last.metadata["component"] == "manifest.json"
