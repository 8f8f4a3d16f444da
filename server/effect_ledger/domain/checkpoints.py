"""Checkpoints: manifests, compatibility verdicts, and the archive format.

A sealed checkpoint holds the runtime's state plus ledger sections copied from the ledger at
one trace revision. Its manifest names the digest of the state, of every artifact and of every
ledger section; its own digest is SHA-256 over the RFC 8785 form of the manifest.

Format versions: ``FORMAT_VERSION`` is what the service writes. Older formats are opened only
through explicit migrations (``migrate_to_current``) that produce a new derived checkpoint and
keep the original; a meaning an old format did not record becomes ``{"status": "unknown"}``,
never a convenient default.
"""

from __future__ import annotations

import enum
import hashlib
import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Any

from effect_ledger.domain import signing
from effect_ledger.domain.canonical import canonical_bytes, parse_json
from effect_ledger.domain.contracts import REFUSED_CHARACTERS, check_identifier, check_text
from effect_ledger.errors import FailedPrecondition, InvalidArgument, PreconditionViolation

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
SECTIONS = ("effects", "approvals", "budgets", "tools", "policy")
# Sections added within format 2: checked whenever the manifest or the ledger names them (an
# archive sealed before they existed has neither, and still verifies).
LATER_SECTIONS = ("schedules",)
ARTIFACTS_MAX = 256
STATE_SIZE_MAX_BYTES = 1024 * 1024
ARCHIVE_SIZE_MAX_BYTES = 32 * 1024 * 1024
ARCHIVE_FILES_MAX = 64
ARCHIVE_FILE_SIZE_MAX_BYTES = 8 * 1024 * 1024
# The sum of the members' sizes as their headers state them, checked before any is read.
ARCHIVE_UNPACKED_SIZE_MAX_BYTES = 32 * 1024 * 1024
FACT_LENGTH_MAX = 256
FACT_REFERENCES_MAX = 256
SIGNATURE_FILE = "manifest.sig"


class ArtifactClass(enum.StrEnum):
    REQUIRED = "REQUIRED"
    OPTIONAL = "OPTIONAL"


class ArtifactStatus(enum.StrEnum):
    PENDING = "PENDING"
    COMPLETE = "COMPLETE"
    TOMBSTONE = "TOMBSTONE"


class Verdict(enum.StrEnum):
    COMPATIBLE = "COMPATIBLE"
    DEGRADED = "DEGRADED"
    INCOMPATIBLE = "INCOMPATIBLE"


def content_digest(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def section_digest(section: Any) -> str:
    return content_digest(canonical_bytes(section))


@dataclass(frozen=True)
class ArtifactRef:
    name: str
    digest: str
    classification: ArtifactClass

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "digest": self.digest, "classification": self.classification.value}


@dataclass(frozen=True)
class Facts:
    runtime: str = ""
    contract_schema: str = ""
    code_version: str = ""
    checkpoint_format: int = 0
    native_references: tuple[str, ...] = ()
    recorded_effects: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "contract_schema": self.contract_schema,
            "code_version": self.code_version,
            "checkpoint_format": self.checkpoint_format,
            "native_references": sorted(self.native_references),
            "recorded_effects": sorted(self.recorded_effects),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Facts:
        return cls(
            runtime=value.get("runtime", ""),
            contract_schema=value.get("contract_schema", ""),
            code_version=value.get("code_version", ""),
            checkpoint_format=int(value.get("checkpoint_format", 0)),
            native_references=tuple(value.get("native_references", ())),
            recorded_effects=tuple(value.get("recorded_effects", ())),
        )


def check_facts(facts: Facts, field: str) -> Facts:
    """Bounded text without control characters in every compatibility fact."""
    for name in ("runtime", "contract_schema", "code_version"):
        check_text(getattr(facts, name), f"{field}.{name}", required=False, length_max=FACT_LENGTH_MAX)
    if not 0 <= facts.checkpoint_format <= 1_000_000:
        raise InvalidArgument.field(f"{field}.checkpoint_format", "must be between 0 and 1000000")
    for name in ("native_references", "recorded_effects"):
        values = getattr(facts, name)
        if len(values) > FACT_REFERENCES_MAX:
            raise InvalidArgument.field(f"{field}.{name}", f"at most {FACT_REFERENCES_MAX}", reason="TOO_MANY")
        for index, value in enumerate(values):
            check_text(value, f"{field}.{name}[{index}]", required=True, length_max=FACT_LENGTH_MAX)
    return facts


def check_artifact_refs(refs: list[ArtifactRef]) -> None:
    if len(refs) > ARTIFACTS_MAX:
        raise InvalidArgument.field("artifacts", f"at most {ARTIFACTS_MAX}", reason="TOO_MANY_ARTIFACTS")
    names = set()
    for index, ref in enumerate(refs):
        field = f"artifacts[{index}]"
        if not ref.name or len(ref.name) > 256 or not safe_member_name(ref.name):
            raise InvalidArgument.field(
                f"{field}.name", "must be a relative path without '..'", reason="INVALID_ARTIFACT"
            )
        if ref.name in names:
            raise InvalidArgument.field(f"{field}.name", "is not unique", reason="INVALID_ARTIFACT")
        names.add(ref.name)
        check_digest(ref.digest, f"{field}.digest")


def check_digest(value: str, field: str) -> str:
    hexpart = value.removeprefix("sha256:")
    if not value.startswith("sha256:") or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise InvalidArgument.field(field, "must be sha256:<64 lowercase hex digits>", reason="INVALID_DIGEST")
    return value


def build_manifest(
    *,
    tenant_id: str,
    run_id: str,
    checkpoint_id: str,
    revision: int,
    state: Any,
    artifacts: list[ArtifactRef],
    ledger: dict[str, Any],
    policy_revision: str,
    sealed_at: str,
    format_version: int = FORMAT_VERSION,
) -> dict[str, Any]:
    return {
        "format_version": format_version,
        "tenant_id": tenant_id,
        "run_id": run_id,
        "checkpoint_id": checkpoint_id,
        "revision": revision,
        "sealed_at": sealed_at,
        "policy_revision": policy_revision,
        "state_digest": section_digest(state),
        "artifacts": [ref.as_json() for ref in sorted(artifacts, key=lambda r: r.name)],
        "sections": {name: section_digest(ledger[name]) for name in sorted(ledger)},
    }


def manifest_problems(
    manifest: dict[str, Any], state: Any, ledger: dict[str, Any], artifacts: list[ArtifactRef]
) -> list[str]:
    """Which components no longer match the manifest (empty: all do)."""
    problems = []
    if manifest.get("state_digest") != section_digest(state):
        problems.append("state")
    if manifest.get("format_version") == FORMAT_VERSION:
        sections = manifest.get("sections")
        listed: dict[str, Any] = sections if isinstance(sections, dict) else {}
        names = [*SECTIONS, *(n for n in LATER_SECTIONS if n in ledger or n in listed)]
    else:
        names = sorted(ledger)
    for name in names:
        if manifest.get("sections", {}).get(name) != (section_digest(ledger[name]) if name in ledger else None):
            problems.append(f"section:{name}")
    if manifest.get("artifacts") != [ref.as_json() for ref in sorted(artifacts, key=lambda r: r.name)]:
        problems.append("artifacts")
    return problems


# --- compatibility -------------------------------------------------------------------------


@dataclass(frozen=True)
class FactProblem:
    fact: str
    reason: str
    degraded_only: bool = False


@dataclass(frozen=True)
class CompatibilityVerdict:
    verdict: Verdict
    problems: tuple[FactProblem, ...] = field(default_factory=tuple)


def compatibility(
    *,
    registered: bool,
    recorded: Facts,
    current: Facts,
    policy_revision: str,
    artifacts: list[ArtifactRef],
    artifact_status: dict[str, ArtifactStatus],
    unresolved_effects: list[str],
    removed_by_retention: dict[str, str] | None = None,
) -> CompatibilityVerdict:
    """One reason per incompatible fact; a missing optional artifact only degrades.

    ``removed_by_retention``: for an artifact retention collected, by digest, what its
    tombstone says (when and under which rule), given as the reason instead of "tombstone"."""
    removed = removed_by_retention or {}
    problems: list[FactProblem] = []
    if not registered:
        problems.append(FactProblem("status", "the checkpoint is not registered; only a registered one can be resumed"))
    for name in ("runtime", "contract_schema", "code_version"):
        before, now = getattr(recorded, name), getattr(current, name)
        if before != now:
            problems.append(FactProblem(name, f"recorded {before!r}, current {now!r}"))
    if current.checkpoint_format < recorded.checkpoint_format:
        problems.append(
            FactProblem(
                "checkpoint_format",
                f"the runtime reads format {current.checkpoint_format}, the checkpoint is {recorded.checkpoint_format}",
            )
        )
    for reference in sorted(set(recorded.native_references) - set(current.native_references)):
        problems.append(
            FactProblem(
                f"native_reference:{reference}", "not available now; native continuation is lost", degraded_only=True
            )
        )
    if not policy_revision:
        problems.append(FactProblem("policy", "the checkpoint holds no policy identity"))
    for ref in sorted(artifacts, key=lambda r: r.name):
        status = artifact_status.get(ref.digest)
        if status != ArtifactStatus.COMPLETE:
            what = "missing" if status is None else removed.get(ref.digest, status.value.lower())
            problems.append(
                FactProblem(
                    f"artifact:{ref.name}",
                    f"{ref.digest} is {what}",
                    degraded_only=ref.classification == ArtifactClass.OPTIONAL,
                )
            )
    carried = set(current.recorded_effects)
    for effect_id in unresolved_effects:
        if effect_id not in carried:
            problems.append(
                FactProblem(
                    f"effect:{effect_id}", "UNKNOWN and not reconciled, and the resuming runtime does not carry it"
                )
            )
    if any(not p.degraded_only for p in problems):
        verdict = Verdict.INCOMPATIBLE
    elif problems:
        verdict = Verdict.DEGRADED
    else:
        verdict = Verdict.COMPATIBLE
    return CompatibilityVerdict(verdict, tuple(problems))


# --- archives ------------------------------------------------------------------------------


def safe_member_name(name: str) -> bool:
    if not name or name.startswith("/") or "\\" in name or REFUSED_CHARACTERS.search(name) or len(name) > 255:
        return False
    normalized = posixpath.normpath(name)
    return normalized == name and not any(part in ("..", ".", "") for part in name.split("/"))


def readme_text(manifest: dict[str, Any], state: Any, ledger: dict[str, Any]) -> str:
    """A human handoff: what the run was doing, what is unknown, what is safe next."""
    effects = ledger.get("effects", {})
    # Format 1 named an effect's stage "state" (a kept original is exported as it was stored).
    open_effects = [
        {**e, "stage": e.get("stage", e.get("state"))}
        for e in (effects.get("open", []) if isinstance(effects, dict) else [])
    ]
    unknown = [e for e in open_effects if e.get("stage") == "UNKNOWN"]
    approvals = ledger.get("approvals", {})
    budgets = ledger.get("budgets", {})
    lines = [
        f"# Checkpoint {manifest['checkpoint_id']} of run {manifest['run_id']}",
        "",
        f"Sealed at trace revision {manifest['revision']} on {manifest['sealed_at']} under policy "
        f"revision {manifest['policy_revision'] or '(none recorded)'}; format {manifest['format_version']}.",
        "",
        "## What the run was doing",
        "",
        "The runtime's own state is in `state.json`. Its top-level keys: "
        + (", ".join(f"`{k}`" for k in sorted(state)) if isinstance(state, dict) and state else "(none)")
        + ".",
        "",
        "## What is unknown",
        "",
    ]
    if unknown:
        lines += [
            f"- effect {e['effect_id']}: {e['tool']} on {e['target']} (key {e['idempotency_key']}) may have happened."
            for e in unknown
        ]
        lines += [
            "",
            "Do not repeat these. Ask the provider (their keys are in `ledger/effects.json`) and reconcile each with evidence.",
        ]
    else:
        lines.append("No effect's outcome is unknown.")
    others = [e for e in open_effects if e.get("stage") != "UNKNOWN"]
    lines += ["", "## Open effects", ""]
    lines += [f"- effect {e['effect_id']}: {e['tool']} on {e['target']} is {e['stage']}." for e in others] or [
        "None besides the unknown ones."
    ]
    pending = approvals.get("pending", []) if isinstance(approvals, dict) else []
    lines += [
        "",
        "## Approvals",
        "",
        f"{len(pending)} pending; see `ledger/approvals.json` (approvals are evidence, not portable power: the gate re-checks them).",
    ]
    if isinstance(budgets, dict) and "budgets" in budgets:
        lines += ["", "## Budgets", ""]
        lines += [
            f"- {b['scope']} {b['dimension']}: limit {b['limit']}, posted {b['posted']}, pending {b['pending']}."
            for b in budgets["budgets"]
        ] or ["No budget applies."]
    scheduled = ledger.get("schedules")
    if isinstance(scheduled, list):  # recorded since scheduled intents exist (still format 2)
        lines += ["", "## Scheduled intents", ""]
        lines += [
            f"- schedule {s['schedule_id']}: {s['tool']} on {s['target']} (key {s['idempotency_key']}), "
            f"{s['purpose']}, reconsidered from {s['next_eligibility']} by the {s['governing_clock']} clock"
            + (f" until {s['deadline']}" if s.get("deadline") else "")
            + "."
            for s in scheduled
        ] or ["None."]
        if scheduled:
            lines.append("")
            lines.append("Each is an intention to reconsider, not a permission: the gate decides again when it is due.")
    lines += [
        "",
        "## What is safe next",
        "",
        "1. Reconcile every unknown effect before anything else; the gate answers RECONCILE_REQUIRED for them.",
        "2. Resume only from a registered, compatible checkpoint (CheckResumeCompatibility).",
        "3. Every new effect is decided again under the policy, approvals and tool contracts in force then.",
        "",
        "This archive holds no credentials and no tokens, and importing it enables no tool.",
    ]
    return "\n".join(lines) + "\n"


def build_archive(files: dict[str, bytes], signature: bytes | None = None) -> bytes:
    """A deterministic tar: regular files only, sorted names, fixed owner and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        entries = dict(files)
        if signature is not None:
            entries[SIGNATURE_FILE] = signature
        for name in sorted(entries):
            content = entries[name]
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def archive_files(
    manifest: dict[str, Any], state: Any, ledger: dict[str, Any], artifacts: list[ArtifactRef]
) -> dict[str, bytes]:
    """Every file of an export except manifest.json, whose digests the manifest lists."""
    files = {
        "state.json": canonical_bytes(state),
        "artifacts.json": canonical_bytes([ref.as_json() for ref in sorted(artifacts, key=lambda r: r.name)]),
        "README.md": readme_text(manifest, state, ledger).encode("utf-8"),
    }
    for name in sorted(ledger):
        files[f"ledger/{name}.json"] = canonical_bytes(ledger[name])
    return files


def export_manifest(manifest: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    return {**manifest, "files": {name: content_digest(content) for name, content in sorted(files.items())}}


def _bad(component: str, message: str, *, precondition: bool = False) -> Exception:
    if precondition:
        return FailedPrecondition(
            f"{component}: {message}",
            reason="ARCHIVE_REFUSED",
            violations=[PreconditionViolation("ARCHIVE_REFUSED", component, message)],
            metadata={"component": component},
        )
    error = InvalidArgument.field(component, message, reason="ARCHIVE_INVALID")
    error.metadata["component"] = component
    return error


@dataclass(frozen=True)
class VerifiedArchive:
    manifest: dict[str, Any]
    manifest_bytes: bytes
    state: Any
    ledger: dict[str, Any]
    artifacts: list[ArtifactRef]
    signed: bool
    signer: str | None = None  # the id of the trusted key that signed the manifest


def _member_label(name: str) -> str:
    """A member's name as an error may show it (control characters escaped)."""
    if not name:
        return "(empty name)"
    return name if REFUSED_CHARACTERS.search(name) is None else ascii(name)[1:-1]


def _judge_member(member: tarfile.TarInfo, seen: set[str], unpacked_bytes: int, archive_bytes: int) -> None:
    """Refuse a member from its header alone: anything but a bounded, safe, regular file."""
    name = member.name
    if not safe_member_name(name):
        raise _bad(_member_label(name), "is not a safe relative path")
    if member.issparse() or member.type == tarfile.GNUTYPE_SPARSE:
        raise _bad(name, "is a sparse file (only regular files are accepted)")
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise _bad(name, "is not a regular file (links, devices, fifos, folders and sparse files are refused)")
    if member.size > ARCHIVE_FILE_SIZE_MAX_BYTES:
        raise _bad(name, f"is larger than {ARCHIVE_FILE_SIZE_MAX_BYTES} bytes")
    if unpacked_bytes + member.size > ARCHIVE_UNPACKED_SIZE_MAX_BYTES:
        raise _bad(name, f"takes the members past {ARCHIVE_UNPACKED_SIZE_MAX_BYTES} bytes unpacked")
    if member.offset_data + member.size > archive_bytes:
        raise _bad(name, "is cut short: the archive ends inside it")
    if name in seen:
        raise _bad(name, "appears twice")


def _members(archive: tarfile.TarFile, archive_bytes: int) -> list[tarfile.TarInfo]:
    """Every member's header, each judged before the archive is read past it (a header claiming
    more bytes than the archive holds names that member, not "archive"); no content is read."""
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    unpacked_bytes = 0
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, EOFError, ValueError) as error:
            raise _bad("archive", f"is not a tar archive: {error}") from None
        if member is None:
            return members
        if len(members) == ARCHIVE_FILES_MAX:
            raise _bad("archive", f"holds more than {ARCHIVE_FILES_MAX} entries")
        _judge_member(member, seen, unpacked_bytes, archive_bytes)
        members.append(member)
        seen.add(member.name)
        unpacked_bytes += member.size


def read_archive(data: bytes) -> dict[str, bytes]:
    """Every member of a tar: regular files only, at most ``ARCHIVE_FILES_MAX`` of them, each at
    most ``ARCHIVE_FILE_SIZE_MAX_BYTES`` and together at most ``ARCHIVE_UNPACKED_SIZE_MAX_BYTES``.
    All headers are judged before any member's content is read into memory."""
    if len(data) > ARCHIVE_SIZE_MAX_BYTES:
        raise _bad("archive", f"is larger than {ARCHIVE_SIZE_MAX_BYTES} bytes")
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:")  # noqa: SIM115 - in memory, read below
    except (tarfile.TarError, EOFError, ValueError) as error:
        raise _bad("archive", f"is not a tar archive: {error}") from None
    files: dict[str, bytes] = {}
    for member in _members(archive, len(data)):
        extracted = archive.extractfile(member)
        if extracted is None:
            raise _bad(member.name, "cannot be read")
        try:
            content = extracted.read()
        except (tarfile.TarError, EOFError, ValueError) as error:
            raise _bad(member.name, f"cannot be read: {error}") from None
        if len(content) != member.size:
            raise _bad(member.name, f"holds {len(content)} bytes, its header says {member.size}")
        files[member.name] = content
    return files


def _parse_member(raw: bytes, *, field: str, **options: Any) -> Any:
    """``parse_json`` for an archive member; its error names the member as the component."""
    try:
        return parse_json(raw, field=field, **options)
    except InvalidArgument as error:
        error.metadata["component"] = field
        raise


def _manifest_field(name: str, description: str) -> Exception:
    return _bad(f"manifest.json: {name}", description)


def _check_text_field(manifest: dict[str, Any], name: str) -> None:
    value = manifest.get(name)
    if not isinstance(value, str):
        raise _manifest_field(name, f"must be a string, not {type(value).__name__}")
    if len(value) > 1024 or REFUSED_CHARACTERS.search(value):
        raise _manifest_field(name, "must be at most 1024 characters without control characters")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53 - 1


def check_manifest_fields(manifest: dict[str, Any]) -> None:
    """Every field of a manifest (any readable format) has its type, each error naming the field."""
    for name in ("tenant_id", "run_id", "checkpoint_id"):
        value = manifest.get(name)
        if not isinstance(value, str):
            raise _manifest_field(name, f"must be a string, not {type(value).__name__}")
        try:
            check_identifier(value, name)
        except InvalidArgument as error:
            raise _manifest_field(name, error.violations[0].description) from None
    for name in ("sealed_at", "policy_revision"):
        _check_text_field(manifest, name)
    if not _is_count(manifest.get("revision")):
        raise _manifest_field("revision", "must be a non-negative integer")
    try:
        state_digest = manifest.get("state_digest")
        check_digest(state_digest if isinstance(state_digest, str) else "", "state_digest")
    except InvalidArgument:
        raise _manifest_field("state_digest", "must be sha256:<64 lowercase hex digits>") from None
    if not isinstance(manifest.get("artifacts"), list) or not all(isinstance(a, dict) for a in manifest["artifacts"]):
        raise _manifest_field("artifacts", "must be a list of artifact references")
    for name in ("sections", "files"):
        value = manifest.get(name)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _manifest_field(name, "must be an object of names to digests")
        if len(value) > ARCHIVE_FILES_MAX:
            raise _manifest_field(name, f"names more than {ARCHIVE_FILES_MAX} entries")
    unknown = sorted(set(manifest) - MANIFEST_FIELDS)
    if unknown:
        raise _manifest_field(unknown[0][:100], "is not a field of a checkpoint manifest")


def unsigned_refusal(signed: bool) -> FailedPrecondition:
    code = "CHECKPOINT_SIGNER_UNKNOWN" if signed else "CHECKPOINT_UNSIGNED"
    what = "is signed by no key this deployment trusts" if signed else "is not signed"
    return FailedPrecondition(
        f"{SIGNATURE_FILE}: the archive {what}; an admin may import it as a new run with allow_unsigned",
        reason=code,
        violations=[PreconditionViolation(code, SIGNATURE_FILE, what)],
        metadata={"component": SIGNATURE_FILE},
    )


def verify_archive(
    data: bytes,
    *,
    tenant_id: str,
    trusted_keys: dict[str, str],
    allow_unsigned: bool = False,
    expected_manifest_digest: str = "",
) -> VerifiedArchive:
    """Check everything, write nothing: the first bad component is named in the error.

    ``trusted_keys``: public keys (PEM, by key id) whose signature of the manifest
    (``manifest.sig``) makes the archive trusted; the key that verifies is returned as
    ``signer``. An archive no trusted key signed is refused (CHECKPOINT_UNSIGNED or
    CHECKPOINT_SIGNER_UNKNOWN; Ed25519 signatures name no key, so a damaged signature and a
    stranger's look alike) unless ``allow_unsigned``; what such an archive may then do is the
    importer's decision (``service.checkpoints.import_archive``). ``expected_manifest_digest``:
    the digest of the manifest's own fields (without its file list) that the importer expects.

    An archive of the current format must be exactly what this service exports: its members'
    digests are in the manifest, the manifest's own fields have their types, fields that appear
    twice agree (the policy revision in the manifest and in ledger/policy.json; README.md is
    derived from the manifest, state and ledger), and the tar itself is the canonical one built
    from those members, so no byte of it can change unnoticed.
    """
    files = read_archive(data)
    if "manifest.json" not in files:
        raise _bad("manifest.json", "is missing")
    manifest_bytes = files["manifest.json"]
    manifest = _parse_member(manifest_bytes, field="manifest.json", size_max_bytes=ARCHIVE_FILE_SIZE_MAX_BYTES)
    if canonical_bytes(manifest) != manifest_bytes:
        raise _bad("manifest.json", "is not in RFC 8785 canonical form")
    version = manifest.get("format_version")
    if not _is_count(version) or version not in READABLE_FORMATS:
        raise _bad(
            "manifest.json", f"format_version {str(version)[:20]!r} is not one this service reads", precondition=True
        )
    check_manifest_fields(manifest)
    listed = manifest["files"]
    for required in ("state.json", "artifacts.json"):
        if required not in listed:
            raise _bad(required, "is missing (the manifest does not list it)")
    expected = set(listed) | {"manifest.json"}
    signed = SIGNATURE_FILE in files
    present = set(files) - ({SIGNATURE_FILE} if signed else set())
    for name in sorted(present - expected):
        raise _bad(name, "is not listed in the manifest")
    for name in sorted(expected - present):
        raise _bad(name, "is listed in the manifest but missing")
    for name in sorted(listed):
        if content_digest(files[name]) != listed[name]:
            raise _bad(name, "does not match its digest in the manifest")
    if manifest.get("tenant_id") != tenant_id:
        raise _bad("manifest.json", "belongs to another tenant", precondition=True)
    signer = signing.signer_of(trusted_keys, manifest_bytes, files.get(SIGNATURE_FILE))
    if signer is None and not allow_unsigned:
        raise unsigned_refusal(signed)
    state = _parse_member(
        files["state.json"], field="state.json", size_max_bytes=ARCHIVE_FILE_SIZE_MAX_BYTES, require_object=False
    )
    ledger = {}
    for name in listed:
        if name.startswith("ledger/") and name.endswith(".json"):
            ledger[name[len("ledger/") : -len(".json")]] = _parse_member(
                files[name], field=name, size_max_bytes=ARCHIVE_FILE_SIZE_MAX_BYTES, require_object=False
            )
    refs_json = _parse_member(
        files["artifacts.json"],
        field="artifacts.json",
        size_max_bytes=ARCHIVE_FILE_SIZE_MAX_BYTES,
        require_object=False,
    )
    try:
        refs = [ArtifactRef(r["name"], r["digest"], ArtifactClass(r["classification"])) for r in refs_json]
    except (KeyError, TypeError, ValueError):
        raise _bad("artifacts.json", "is not a list of artifact references") from None
    check_artifact_refs(refs)
    core = {k: v for k, v in manifest.items() if k != "files"}
    problems = manifest_problems(core, state, ledger, refs)
    if problems:
        raise _bad(problems[0], "does not match the manifest")
    if expected_manifest_digest and section_digest(core) != expected_manifest_digest:
        raise _bad("manifest.json", "does not have the manifest digest the importer expects", precondition=True)
    if version == FORMAT_VERSION:
        _check_current_format(data, files, core, state, ledger)
    return VerifiedArchive(core, manifest_bytes, state, ledger, refs, signed, signer)


MANIFEST_FIELDS = frozenset(
    {
        "format_version",
        "tenant_id",
        "run_id",
        "checkpoint_id",
        "revision",
        "sealed_at",
        "policy_revision",
        "state_digest",
        "artifacts",
        "sections",
        "files",
    }
)


def _check_current_format(
    data: bytes, files: dict[str, bytes], core: dict[str, Any], state: Any, ledger: dict[str, Any]
) -> None:
    """The rest of what an archive of the current format must satisfy (see verify_archive)."""
    policy = ledger.get("policy")
    if not isinstance(policy, dict) or policy.get("revision") != core["policy_revision"]:
        raise _bad("ledger/policy.json", "its revision disagrees with the manifest's policy_revision")
    try:
        readme = readme_text(core, state, ledger).encode("utf-8")
    except (AttributeError, KeyError, TypeError, ValueError):
        raise _bad(
            "README.md", "cannot be derived: a ledger section does not have the shape this format records"
        ) from None
    if files.get("README.md") != readme:
        raise _bad("README.md", "does not describe this manifest, state and ledger")
    members = {name: content for name, content in files.items() if name != SIGNATURE_FILE}
    if build_archive(members, files.get(SIGNATURE_FILE)) != data:
        raise _bad("archive", "is not the canonical tar of its members (a header, padding or trailer byte changed)")


# --- format migrations ---------------------------------------------------------------------

UNKNOWN = {"status": "unknown"}


def migrate_to_current(manifest: dict[str, Any], ledger: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Ledger sections of an older format in the current one; returns (ledger, notes).

    Format 1 recorded no budgets, no approval quorum, and named an effect's stage "state".
    Those meanings cannot be inferred: they become unknown, never a default.
    """
    version = manifest.get("format_version")
    if version == FORMAT_VERSION:
        return ledger, []
    if version != 1:
        raise _bad("manifest.json", f"no migration from format {version!r}", precondition=True)
    for name in ("effects", "approvals", "budgets"):
        if name in ledger and not isinstance(ledger[name], dict):
            raise _bad(f"ledger/{name}.json", "must be a JSON object")
    try:
        return _migrate_format_1(ledger)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise _bad("ledger", "a ledger section does not have the shape format 1 recorded") from None


def _migrate_format_1(ledger: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    notes = []
    effects = dict(ledger.get("effects", {}))
    migrated_open = []
    for effect in effects.get("open", []):
        effect = dict(effect)
        if "stage" not in effect:
            effect["stage"] = effect.pop("state", "UNKNOWN")
        migrated_open.append(effect)
    effects["open"] = migrated_open
    effects.setdefault("settled", [])
    approvals = dict(ledger.get("approvals", {}))
    for key in ("pending", "active", "denied"):
        approvals[key] = [{**a, "quorum": a.get("quorum", UNKNOWN)} for a in approvals.get(key, [])]
    notes.append("approvals: quorum unknown (format 1 did not record it)")
    budgets = ledger.get("budgets", {**UNKNOWN, "reason": "format 1 recorded no budgets"})
    if "budgets" not in ledger:
        notes.append("budgets: unknown (format 1 did not record them)")
    migrated = {
        "effects": effects,
        "approvals": approvals,
        "budgets": budgets,
        "tools": ledger.get("tools", UNKNOWN),
        "policy": ledger.get("policy", UNKNOWN),
    }
    return migrated, notes
