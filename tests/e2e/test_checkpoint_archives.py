"""Checkpoint archives over real gRPC, on PostgreSQL and on SQLite: what an export holds, and
every way of tampering with one that an import must refuse before writing anything.

Tampered archives are rebuilt with ``tarfile`` from the exported bytes. Every refusal must
name the first bad component (ErrorInfo metadata ``component`` and the field violation or
precondition subject), and leave the run as it was: no new checkpoint, same trace revision.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass

import pytest

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import (
    ARCHIVE_FILE_SIZE_MAX_BYTES,
    ARCHIVE_FILES_MAX,
    SIGNATURE_FILE,
)
from effect_ledger.errors import LedgerError
from effectledger.v1 import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    runs_pb2,
)
from support import (
    authorize_request,
    checkpoints_stub,
    contract,
    new_run,
    new_tenant,
    raises_error,
    unknown,
)

EXPECTED_FILES = {
    "manifest.json",
    "state.json",
    "artifacts.json",
    "README.md",
    "ledger/effects.json",
    "ledger/approvals.json",
    "ledger/budgets.json",
    "ledger/tools.json",
    "ledger/policy.json",
    "ledger/schedules.json",
}
STATE = {"plan": ["reply to bob", "wire the deposit"], "step": 2, "notes": "waiting on the provider"}
WIRE = "payment.wire"
CHUNK = 64 * 1024


# --- archive helpers (shared shape with the signing and format tests) ------------------------


def sha256(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def chunks(data: bytes) -> list[checkpoints_pb2.ArchiveChunk]:
    return [checkpoints_pb2.ArchiveChunk(data=data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)] or [
        checkpoints_pb2.ArchiveChunk()
    ]


def export(stub, checkpoint_id: str) -> bytes:
    return b"".join(
        c.data for c in stub.ExportCheckpoint(checkpoints_pb2.ExportCheckpointRequest(checkpoint_id=checkpoint_id))
    )


def import_archive(stub, data: bytes, allow_unsigned: bool = False) -> checkpoints_pb2.Checkpoint:
    parts = chunks(data)
    parts[0].allow_unsigned = allow_unsigned
    return stub.ImportCheckpoint(iter(parts))


def read_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}


def regular(name: str, content: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = 0o644
    return info, content


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info, None


def tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def tar_files(files: dict[str, bytes], extra: list[tuple[tarfile.TarInfo, bytes | None]] = ()) -> bytes:
    return tar([regular(name, files[name]) for name in sorted(files)] + list(extra))


def flip(content: bytes, index: int = -2) -> bytes:
    changed = bytearray(content)
    changed[index] ^= 0x01
    return bytes(changed)


def with_manifest(files: dict[str, bytes], change) -> dict[str, bytes]:
    """The files with manifest.json rewritten (canonically) by ``change(manifest)``."""
    manifest = json.loads(files["manifest.json"])
    change(manifest)
    return {**files, "manifest.json": canonical_bytes(manifest)}


def checkpoint_ids(stub, run_id: str) -> list[str]:
    found, token = [], ""
    while True:
        page = stub.ListCheckpoints(
            checkpoints_pb2.ListCheckpointsRequest(run_id=run_id, page_size=500, page_token=token)
        )
        found += [c.checkpoint_id for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            return found


def assert_refused(
    stub, runs, run_id: str, data: bytes, code: str, component: str, *, reason: str = "", allow_unsigned: bool = False
) -> None:
    """The import fails with ``code`` (and ``reason``, by default the archive's) naming
    ``component``; the run has no new checkpoint and no new trace event."""
    before_ids = checkpoint_ids(stub, run_id)
    before_revision = runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    reason = reason or ("ARCHIVE_INVALID" if code == "INVALID_ARGUMENT" else "ARCHIVE_REFUSED")
    with raises_error(code, reason):
        import_archive(stub, data, allow_unsigned)
    error = raises_error.last
    assert error.metadata.get("component") == component, (error.metadata, error.message)
    if code == "INVALID_ARGUMENT":
        assert [v.field for v in error.violations] == [component], error.violations
    else:
        assert [v.subject for v in error.violations] == [component], error.violations
    assert checkpoint_ids(stub, run_id) == before_ids
    assert runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision == before_revision


# --- a sealed checkpoint with everything a resume must not forget ----------------------------


@dataclass
class Exported:
    tenant: object
    stub: object
    admin_stub: object
    agent: object
    run_id: str
    checkpoint: checkpoints_pb2.Checkpoint
    unknown_effect_id: str
    approval_id: str
    budget_id: str
    artifact_digest: str
    archive: bytes

    @property
    def files(self) -> dict[str, bytes]:
        return read_members(self.archive)


def seal_and_export(server, tenant) -> Exported:
    admin, agent = tenant.client(server, "admin"), tenant.client(server, "agent")
    stub = checkpoints_stub(server, tenant.tokens["agent"])
    admin.tools.PutToolContract(contract())
    admin.tools.PutToolContract(
        contract(WIRE, effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
    )
    budget = admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="usd_micros", limit=5_000_000)
    )
    run_id = new_run(agent)
    sent = agent.gate.AuthorizeEffect(authorize_request(run_id, "send-1"))
    agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=sent.attempt_id))
    agent.gate.RecordOutcome(unknown(sent.attempt_id, "connection reset after sending"))
    approval = agent.approvals.RequestApproval(
        approvals_pb2.RequestApprovalRequest(
            run_id=run_id,
            tool=WIRE,
            arguments_json=b'{"amount":100,"to":"acct-1"}',
            target="bank:acct-1",
            reason="deposit for the order",
        )
    )
    artifact = stub.PutArtifact(
        checkpoints_pb2.PutArtifactRequest(content=b"overlay bytes", media_type="application/x-tar")
    )
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = stub.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(
            run_id=run_id,
            expected_revision=revision,
            state_json=json.dumps(STATE).encode(),
            artifacts=[
                checkpoints_pb2.ArtifactRef(
                    name="workspace/overlay.tar", digest=artifact.digest, classification=checkpoints_pb2.REQUIRED
                )
            ],
            facts=checkpoints_pb2.CompatibilityFacts(
                runtime="agent-runtime/3", code_version="1.4.0", checkpoint_format=2
            ),
        )
    )
    return Exported(
        tenant=tenant,
        stub=stub,
        admin_stub=checkpoints_stub(server, tenant.tokens["admin"]),
        agent=agent,
        run_id=run_id,
        checkpoint=sealed,
        unknown_effect_id=sent.effect_id,
        approval_id=approval.approval_id,
        budget_id=budget.budget_id,
        artifact_digest=artifact.digest,
        archive=export(stub, sealed.checkpoint_id),
    )


@pytest.fixture(scope="module")
def exported(server, database_url) -> Exported:
    """One sealed, exported checkpoint per backend; refused imports write nothing, so the
    tamper tests can share it (each compares the run before and after its own import)."""
    return seal_and_export(server, new_tenant(database_url))


# --- what an export holds ------------------------------------------------------------------


def test_export_holds_exactly_the_documented_files(exported):
    files = exported.files
    assert set(files) == EXPECTED_FILES | {SIGNATURE_FILE}
    with tarfile.open(fileobj=io.BytesIO(exported.archive), mode="r:") as archive:
        for member in archive.getmembers():
            assert member.isreg() and not member.name.startswith("/") and ".." not in member.name.split("/")


def test_manifest_is_canonical_and_lists_every_other_file(exported):
    files = exported.files
    raw = files["manifest.json"]
    manifest = json.loads(raw)
    assert canonical_bytes(json.loads(raw)) == raw
    assert set(manifest["files"]) == EXPECTED_FILES - {"manifest.json"}
    for name, digest in manifest["files"].items():
        assert digest == sha256(files[name]), name
    assert manifest["format_version"] == 2
    assert manifest["tenant_id"] == exported.tenant.name
    assert manifest["run_id"] == exported.run_id and manifest["checkpoint_id"] == exported.checkpoint.checkpoint_id
    assert manifest["revision"] == exported.checkpoint.revision
    # The manifest's own digests of the contents agree with the files that carry them.
    assert manifest["state_digest"] == sha256(files["state.json"])
    for section in ("effects", "approvals", "budgets", "tools", "policy"):
        assert manifest["sections"][section] == sha256(files[f"ledger/{section}.json"]), section
    assert manifest["artifacts"] == json.loads(files["artifacts.json"])
    # The exported manifest is the sealed one plus the file list.
    sealed = json.loads(exported.checkpoint.manifest_json)
    assert {k: v for k, v in manifest.items() if k != "files"} == sealed


def test_archive_contents_match_the_sealed_checkpoint(exported):
    files = exported.files
    assert json.loads(files["state.json"]) == STATE
    assert json.loads(files["artifacts.json"]) == [
        {"name": "workspace/overlay.tar", "digest": exported.artifact_digest, "classification": "REQUIRED"}
    ]
    ledger = json.loads(exported.checkpoint.ledger_json)
    for section in ("effects", "approvals", "budgets", "tools", "policy"):
        assert json.loads(files[f"ledger/{section}.json"]) == ledger[section], section
    effects = json.loads(files["ledger/effects.json"])
    assert [(e["effect_id"], e["stage"]) for e in effects["open"]] == [(exported.unknown_effect_id, "UNKNOWN")]
    approvals = json.loads(files["ledger/approvals.json"])
    assert [a["approval_id"] for a in approvals["pending"]] == [exported.approval_id]
    assert approvals["pending"][0]["quorum"] == 1
    budgets = json.loads(files["ledger/budgets.json"])
    assert [b["budget_id"] for b in budgets["budgets"]] == [exported.budget_id]
    assert budgets["budgets"][0]["limit"] == 5_000_000
    assert set(json.loads(files["ledger/tools.json"])) == {"email.send"}
    assert json.loads(files["ledger/policy.json"])["revision"] == exported.checkpoint.policy_revision


def test_readme_is_a_handoff(exported):
    readme = exported.files["README.md"].decode("utf-8")
    assert exported.checkpoint.checkpoint_id in readme and exported.run_id in readme
    # What the run was doing.
    assert "## What the run was doing" in readme
    for key in STATE:
        assert f"`{key}`" in readme
    # What is unknown.
    unknown_part = readme.split("## What is unknown", 1)[1].split("\n## ", 1)[0]
    assert exported.unknown_effect_id in unknown_part and "may have happened" in unknown_part
    assert "send-1" in unknown_part and "Do not repeat" in unknown_part
    assert "1 pending" in readme
    assert "usd_micros: limit 5000000" in readme
    # What is safe next.
    safe_part = readme.split("## What is safe next", 1)[1]
    assert "Reconcile every unknown effect" in safe_part
    assert "registered, compatible checkpoint" in safe_part


def test_no_credentials_or_tokens_in_any_file(exported):
    tokens = list(exported.tenant.tokens.values())
    assert tokens and all(t.startswith("elt_") for t in tokens)
    for name, content in exported.files.items():
        for token in tokens:
            assert token.encode() not in content, name
            assert token.removeprefix("elt_").encode() not in content, name
        assert b"elt_" not in content, name
        assert b"Bearer" not in content, name
    for token in tokens:
        assert token.encode() not in exported.archive


def test_the_untouched_archive_imports(exported):
    """The control for every tamper test below: the same bytes, unchanged, are accepted."""
    before = checkpoint_ids(exported.stub, exported.run_id)
    imported = import_archive(exported.stub, exported.archive)
    assert imported.run_id == exported.run_id and imported.format_version == 2
    assert imported.imported_from_digest and imported.checkpoint_id not in before
    assert json.loads(imported.ledger_json) == json.loads(exported.checkpoint.ledger_json)
    assert checkpoint_ids(exported.stub, exported.run_id) == sorted(before + [imported.checkpoint_id])
    # A rebuilt archive with the same members (other tar metadata) is the same archive.
    assert import_archive(exported.stub, tar_files(exported.files)).run_id == exported.run_id


# --- tampering -----------------------------------------------------------------------------


def _flipped(name):
    return lambda files: tar_files({**files, name: flip(files[name])})


def _removed(name):
    return lambda files: tar_files({k: v for k, v in files.items() if k != name})


def _removed_and_delisted(name):
    def build(files):
        rest = {k: v for k, v in files.items() if k != name}
        return tar_files(with_manifest(rest, lambda m: m["files"].pop(name)))

    return build


def _rewritten_with_file_digest(name, content):
    """The file replaced and its digest in the manifest's file list updated to match."""

    def build(files):
        changed = {**files, name: content}
        return tar_files(with_manifest(changed, lambda m: m["files"].__setitem__(name, sha256(content))))

    return build


def _renamed(old, new):
    def build(files):
        rest = {k: v for k, v in files.items() if k != old}
        return tar_files({**rest, new: files[old]})

    return build


def _added(entry_factory):
    return lambda files: tar_files(files, [entry_factory(files)])


def _too_many(files):
    count = ARCHIVE_FILES_MAX + 1 - len(files)
    return tar_files(files, [regular(f"extra/{i:03d}.txt", b"x") for i in range(count)])


def _oversized_real(files):
    """A real member one byte over the per-file limit (the archive stays under the total limit)."""
    return tar_files(files, [regular("big.bin", b"\0" * (ARCHIVE_FILE_SIZE_MAX_BYTES + 1))])


def _oversized_claimed(files):
    """A member whose header claims a terabyte; its content is not there."""
    info = tarfile.TarInfo("big.bin")
    info.size = 2**40
    header = info.tobuf(tarfile.PAX_FORMAT)
    return header + b"\0" * 4096


def _truncated(files):
    """state.json's header claims its full size, the archive ends halfway through it."""
    blocks = b""
    for name in sorted(files):
        if name != "state.json":
            info, content = regular(name, files[name])
            blocks += info.tobuf(tarfile.PAX_FORMAT) + content + b"\0" * (-len(content) % tarfile.BLOCKSIZE)
    info, content = regular("state.json", files["state.json"])
    return blocks + info.tobuf(tarfile.PAX_FORMAT) + content[: len(content) // 2]


def _not_canonical(files):
    pretty = json.dumps(json.loads(files["manifest.json"]), indent=2).encode()
    return tar_files({**files, "manifest.json": pretty})


def _reordered_keys(files):
    manifest = json.loads(files["manifest.json"])
    reordered = json.dumps(dict(reversed(list(manifest.items()))), separators=(",", ":")).encode()
    assert reordered != files["manifest.json"]
    return tar_files({**files, "manifest.json": reordered})


def _format(version):
    return lambda files: tar_files(with_manifest(files, lambda m: m.__setitem__("format_version", version)))


TAMPERED = {
    # A flipped byte: the file no longer matches its digest in the manifest.
    "flipped state.json": (_flipped("state.json"), "INVALID_ARGUMENT", "state.json"),
    "flipped ledger/effects.json": (_flipped("ledger/effects.json"), "INVALID_ARGUMENT", "ledger/effects.json"),
    "flipped ledger/budgets.json": (_flipped("ledger/budgets.json"), "INVALID_ARGUMENT", "ledger/budgets.json"),
    "flipped artifacts.json": (_flipped("artifacts.json"), "INVALID_ARGUMENT", "artifacts.json"),
    "flipped README.md": (_flipped("README.md"), "INVALID_ARGUMENT", "README.md"),
    # The file and its listed digest changed together: the manifest's content digests still refuse it.
    "state.json rewritten, file digest updated": (
        _rewritten_with_file_digest("state.json", b'{"plan":[],"step":0}'),
        "INVALID_ARGUMENT",
        "state",
    ),
    "ledger/effects.json emptied, file digest updated": (
        _rewritten_with_file_digest("ledger/effects.json", b'{"open":[],"settled":[]}'),
        "INVALID_ARGUMENT",
        "section:effects",
    ),
    "artifacts.json emptied, file digest updated": (
        _rewritten_with_file_digest("artifacts.json", b"[]"),
        "INVALID_ARGUMENT",
        "artifacts",
    ),
    # Removed files.
    "removed ledger/tools.json": (_removed("ledger/tools.json"), "INVALID_ARGUMENT", "ledger/tools.json"),
    "removed state.json": (_removed("state.json"), "INVALID_ARGUMENT", "state.json"),
    "removed manifest.json": (_removed("manifest.json"), "INVALID_ARGUMENT", "manifest.json"),
    "removed state.json and its listing": (_removed_and_delisted("state.json"), "INVALID_ARGUMENT", "state.json"),
    "removed artifacts.json and its listing": (
        _removed_and_delisted("artifacts.json"),
        "INVALID_ARGUMENT",
        "artifacts.json",
    ),
    "removed ledger/effects.json and its listing": (
        _removed_and_delisted("ledger/effects.json"),
        "INVALID_ARGUMENT",
        "section:effects",
    ),
    # Added files.
    "added notes.txt": (_added(lambda f: regular("notes.txt", b"hello")), "INVALID_ARGUMENT", "notes.txt"),
    "added ledger/extra.json": (
        _added(lambda f: regular("ledger/extra.json", b"{}")),
        "INVALID_ARGUMENT",
        "ledger/extra.json",
    ),
    "added a duplicate state.json": (
        _added(lambda f: regular("state.json", f["state.json"])),
        "INVALID_ARGUMENT",
        "state.json",
    ),
    # A renamed file: the new name is not listed (checked before the old one being missing).
    "renamed state.json": (_renamed("state.json", "state.old.json"), "INVALID_ARGUMENT", "state.old.json"),
    "renamed ledger/effects.json": (
        _renamed("ledger/effects.json", "effects.json"),
        "INVALID_ARGUMENT",
        "effects.json",
    ),
    # Paths that would leave the extraction folder.
    "member ../x": (_added(lambda f: regular("../x", b"x")), "INVALID_ARGUMENT", "../x"),
    "member /abs": (_added(lambda f: regular("/abs", b"x")), "INVALID_ARGUMENT", "/abs"),
    "member ledger/../../x": (_added(lambda f: regular("ledger/../../x", b"x")), "INVALID_ARGUMENT", "ledger/../../x"),
    "member ./state.json": (_added(lambda f: regular("./state.json", b"x")), "INVALID_ARGUMENT", "./state.json"),
    # Anything but a regular file.
    "symlink member": (_added(lambda f: special("link", tarfile.SYMTYPE, "/etc/passwd")), "INVALID_ARGUMENT", "link"),
    "symlink over state.json": (
        lambda f: tar_files(
            {k: v for k, v in f.items() if k != "state.json"}, [special("state.json", tarfile.SYMTYPE, "README.md")]
        ),
        "INVALID_ARGUMENT",
        "state.json",
    ),
    "hardlink member": (_added(lambda f: special("hard", tarfile.LNKTYPE, "state.json")), "INVALID_ARGUMENT", "hard"),
    "character device member": (_added(lambda f: special("dev", tarfile.CHRTYPE)), "INVALID_ARGUMENT", "dev"),
    "block device member": (_added(lambda f: special("blk", tarfile.BLKTYPE)), "INVALID_ARGUMENT", "blk"),
    "fifo member": (_added(lambda f: special("fifo", tarfile.FIFOTYPE)), "INVALID_ARGUMENT", "fifo"),
    "directory member": (_added(lambda f: special("ledger", tarfile.DIRTYPE)), "INVALID_ARGUMENT", "ledger"),
    # Bounds.
    "member over the per-file limit": (_oversized_real, "INVALID_ARGUMENT", "big.bin"),
    "member header claiming a terabyte": (_oversized_claimed, "INVALID_ARGUMENT", "big.bin"),
    "member content cut short": (_truncated, "INVALID_ARGUMENT", "state.json"),
    "more members than the limit": (_too_many, "INVALID_ARGUMENT", "archive"),
    "not a tar archive": (lambda f: b"this is not a tar archive" * 40, "INVALID_ARGUMENT", "archive"),
    # The manifest itself.
    "manifest pretty-printed": (_not_canonical, "INVALID_ARGUMENT", "manifest.json"),
    "manifest keys reordered": (_reordered_keys, "INVALID_ARGUMENT", "manifest.json"),
    "format_version 3": (_format(3), "FAILED_PRECONDITION", "manifest.json"),
    "format_version 0": (_format(0), "FAILED_PRECONDITION", "manifest.json"),
    "format_version missing": (
        lambda f: tar_files(with_manifest(f, lambda m: m.pop("format_version"))),
        "FAILED_PRECONDITION",
        "manifest.json",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_archive_is_refused_before_any_write(exported, case):
    build, code, component = TAMPERED[case]
    data = build(exported.files)
    assert data != exported.archive
    # As an agent: refused, naming the part, or the signature when the change got past the file
    # digests (the manifest it signs changed, or it was taken away); nothing written.
    before_ids = checkpoint_ids(exported.stub, exported.run_id)
    with pytest.raises(LedgerError) as caught:
        import_archive(exported.stub, data)
    error = caught.value
    seen = (error.grpc_code.name, error.metadata.get("component"))
    signature_refusal = ("FAILED_PRECONDITION", SIGNATURE_FILE)
    assert seen in ((code, component), signature_refusal), (seen, error.message)
    if seen == signature_refusal:
        assert error.reason in ("CHECKPOINT_UNSIGNED", "CHECKPOINT_SIGNER_UNKNOWN")
    assert checkpoint_ids(exported.stub, exported.run_id) == before_ids
    # As an admin who imports unsigned archives on purpose: every layer behind the signature
    # still refuses, naming the part.
    assert_refused(
        exported.admin_stub, exported.agent.runs, exported.run_id, data, code, component, allow_unsigned=True
    )


def test_a_signature_file_is_not_a_way_to_smuggle_content(exported):
    """A manifest.sig that verifies nothing adds nothing: tampering beside it is refused, naming
    the tampered part (file digests are checked before the signature)."""
    files = {**exported.files, SIGNATURE_FILE: b"\0" * 64}
    assert_refused(
        exported.stub,
        exported.agent.runs,
        exported.run_id,
        tar_files({**files, "state.json": flip(files["state.json"])}),
        "INVALID_ARGUMENT",
        "state.json",
    )


def test_an_archive_of_another_tenant_is_refused(server, database_url, exported):
    other = new_tenant(database_url)
    other_stub = checkpoints_stub(server, other.tokens["agent"])
    other_agent = other.client(server, "agent")
    with raises_error("FAILED_PRECONDITION", "ARCHIVE_REFUSED"):
        import_archive(other_stub, exported.archive)
    error = raises_error.last
    assert error.metadata["component"] == "manifest.json"
    assert [v.subject for v in error.violations] == ["manifest.json"]
    assert "another tenant" in error.message
    # Nothing was written in the other tenant: the run the archive names does not exist there.
    with raises_error("NOT_FOUND"):
        other_agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=exported.run_id))
    with raises_error("NOT_FOUND"):
        other_stub.ListCheckpoints(checkpoints_pb2.ListCheckpointsRequest(run_id=exported.run_id))
    # And in a run of its own the other tenant also gets no checkpoint.
    own_run = new_run(other_agent)
    revision = other_agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=own_run)).revision
    files = exported.files
    retargeted = tar_files(with_manifest(files, lambda m: m.__setitem__("run_id", own_run)))
    assert_refused(other_stub, other_agent.runs, own_run, retargeted, "FAILED_PRECONDITION", "manifest.json")
    assert other_agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=own_run)).revision == revision


# --- every byte, the manifest's own fields, and a pinned digest ------------------------------


def _consistent(files: dict[str, bytes], change) -> dict[str, bytes]:
    """The files with the manifest changed by ``change(manifest)`` and everything derivable made
    to agree again: README.md regenerated, the manifest's file digests recomputed, the signature
    dropped (a forger has no trusted key). What is left to catch such a forgery is what cannot be
    derived: the signature (an unsigned archive is refused, see test_checkpoint_signing), and
    for an admin who imports it unsigned on purpose, a pinned digest and fields that appear
    twice."""
    from effect_ledger.domain.checkpoints import readme_text

    manifest = json.loads(files["manifest.json"])
    change(manifest)
    core = {k: v for k, v in manifest.items() if k != "files"}
    ledger = {
        name[len("ledger/") : -len(".json")]: json.loads(content)
        for name, content in files.items()
        if name.startswith("ledger/")
    }
    readme = readme_text(core, json.loads(files["state.json"]), ledger).encode("utf-8")
    changed = {name: content for name, content in files.items() if name != SIGNATURE_FILE}
    changed["README.md"] = readme
    manifest["files"] = {name: sha256(content) for name, content in sorted(changed.items()) if name != "manifest.json"}
    return {**changed, "manifest.json": canonical_bytes(manifest)}


def test_fifty_random_single_byte_corruptions_are_all_refused(exported):
    """Any byte of the archive (member contents, tar headers, padding, the trailer), changed:
    refused, naming the part, and nothing written."""
    import random

    rng = random.Random(20261130)
    positions = sorted(rng.sample(range(len(exported.archive)), 50))
    named = set()
    for position in positions:
        corrupted = bytearray(exported.archive)
        corrupted[position] ^= rng.randrange(1, 256)
        before_ids = checkpoint_ids(exported.stub, exported.run_id)
        before_revision = exported.agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=exported.run_id)).revision
        try:
            import_archive(exported.stub, bytes(corrupted))
        except Exception as error:
            code = error.grpc_code.name  # type: ignore[attr-defined]
            assert code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), (position, code, error)
            component = error.metadata.get("component")  # type: ignore[attr-defined]
            assert component, (position, error)
            named.add(component)
        else:
            raise AssertionError(f"a corruption at byte {position} of {len(exported.archive)} was imported")
        assert checkpoint_ids(exported.stub, exported.run_id) == before_ids
        assert exported.agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=exported.run_id)).revision == before_revision
    assert len(named) >= 2, named  # the parts hit are named, not one blanket answer


def test_a_changed_policy_revision_contradicts_the_ledger(exported):
    files = _consistent(exported.files, lambda m: m.__setitem__("policy_revision", m["policy_revision"][:-1] + "0"))
    assert_refused(
        exported.admin_stub,
        exported.agent.runs,
        exported.run_id,
        tar_files(files),
        "INVALID_ARGUMENT",
        "ledger/policy.json",
        allow_unsigned=True,
    )


def test_a_changed_revision_is_refused_when_the_digest_is_pinned(exported):
    """A revision rewritten with everything derivable made to agree is the forgery a pinned
    digest exists for: the importer passes the digest it got from the exporter."""
    forged = tar_files(_consistent(exported.files, lambda m: m.__setitem__("revision", m["revision"] + 2)))
    pinned = exported.checkpoint.manifest_digest
    before_ids = checkpoint_ids(exported.stub, exported.run_id)
    with raises_error("FAILED_PRECONDITION", "ARCHIVE_REFUSED"):
        exported.admin_stub.ImportCheckpoint(
            iter([checkpoints_pb2.ArchiveChunk(data=forged, expected_manifest_digest=pinned, allow_unsigned=True)])
        )
    assert raises_error.last.metadata["component"] == "manifest.json"
    assert checkpoint_ids(exported.stub, exported.run_id) == before_ids
    # The genuine archive with the same pin imports.
    chunks_pinned = chunks(exported.archive)
    chunks_pinned[0].expected_manifest_digest = pinned
    assert exported.stub.ImportCheckpoint(iter(chunks_pinned)).run_id == exported.run_id


def test_manifest_fields_of_the_wrong_type_are_invalid(exported):
    files = _consistent(exported.files, lambda m: m.__setitem__("revision", "abc"))
    assert_refused(
        exported.admin_stub,
        exported.agent.runs,
        exported.run_id,
        tar_files(files),
        "INVALID_ARGUMENT",
        "manifest.json: revision",
        allow_unsigned=True,
    )
