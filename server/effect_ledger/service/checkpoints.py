"""Checkpoints: seal, register, check, resume, fork, export, import; and the sibling lifetimes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from effect_ledger.domain import checkpoints as rules
from effect_ledger.domain import signing
from effect_ledger.domain.approvals import ApprovalState
from effect_ledger.domain.canonical import canonical_bytes, parse_json
from effect_ledger.domain.checkpoints import ArtifactRef, ArtifactStatus, Facts, Verdict
from effect_ledger.domain.contracts import check_identifier, check_text
from effect_ledger.domain.gate_rules import expired_in_memory
from effect_ledger.domain.model import OPEN_STAGES, Effect, Principal, Role, Stage
from effect_ledger.domain.schedules import SECTION_SCHEDULES_MAX
from effect_ledger.domain.trace import timestamp_text
from effect_ledger.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
)
from effect_ledger.policy.engine import PolicyEngine
from effect_ledger.service import quotas, retention, schedules
from effect_ledger.storage import approval_store, budget_store, key_store, schedule_store
from effect_ledger.storage import checkpoint_store as store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.checkpoint_store import CheckpointRecord
from effect_ledger.storage.engine import Database, UnitOfWork

SECTION_ROWS_MAX = 1000
ARTIFACT_CONTENT_MAX_BYTES = 2 * 1024 * 1024
LIFETIME_KEY = "lifetime"


def _refused(reason: str, subject: str, message: str, **metadata: str) -> FailedPrecondition:
    return FailedPrecondition(
        message, reason=reason, violations=[PreconditionViolation(reason, subject, message)], metadata=metadata
    )


def live_continuation_refused() -> FailedPrecondition:
    return _refused(
        "LIVE_CONTINUATION_NOT_STORABLE",
        "lifetime/live_continuation",
        "a live continuation holds process-local values and is never stored; seal a checkpoint instead",
    )


# --- ledger sections -----------------------------------------------------------------------


def _effect_section(effect: Effect, contracts: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    return {
        "effect_id": effect.effect_id,
        "tool": effect.tool,
        "tool_revision": effect.tool_revision,
        "contract": contracts.get((effect.tool, effect.tool_revision)),
        "target": effect.target,
        "idempotency_key": effect.idempotency_key,
        "intent_digest": effect.intent_digest,
        "arguments": effect.arguments,
        "stage": effect.stage.value,
        "attempts": [
            {
                "attempt_id": a.attempt_id,
                "number": a.number,
                "stage": a.stage.value,
                "provider_idempotency_key": a.provider_key,
                "provider_key_reused": a.provider_key_reused,
                "outcome_reason": a.outcome_reason,
                "failure_evidence": a.failure_evidence.value if a.failure_evidence else None,
                "receipt": (
                    {
                        "provider_reference": a.receipt.provider_reference,
                        "detail": a.receipt.detail,
                        "digest": a.receipt.digest,
                    }
                    if a.receipt
                    else None
                ),
                "approval_id": a.approval_id or None,
            }
            for a in effect.attempts
        ],
    }


async def ledger_sections(unit: UnitOfWork, tenant_id: str, run: Any, policy: PolicyEngine) -> dict[str, Any]:
    """Everything the ledger holds that a resume must not forget, read now, never from a caller."""
    connection = unit.connection
    found = await repo.run_effects(connection, tenant_id, run.run_id, SECTION_ROWS_MAX)
    for effect in found:
        expired_in_memory(effect, unit.now)
    contracts: dict[tuple[str, int], dict[str, Any]] = {}
    tools_section: dict[str, Any] = {}
    for tool, revision in sorted({(e.tool, e.tool_revision) for e in found}):
        pinned = await repo.contract_revision(connection, tenant_id, tool, revision)
        current = await repo.latest_contract(connection, tenant_id, tool)
        contracts[(tool, revision)] = pinned.as_policy_fact() if pinned else None  # type: ignore[assignment]
        tools_section.setdefault(
            tool, {"pinned_revisions": [], "current": current.as_policy_fact() if current else None}
        )
        tools_section[tool]["pinned_revisions"].append(revision)
    open_effects = [_effect_section(e, contracts) for e in found if e.stage in OPEN_STAGES]
    settled = [
        {
            "effect_id": e.effect_id,
            "tool": e.tool,
            "target": e.target,
            "idempotency_key": e.idempotency_key,
            "intent_digest": e.intent_digest,
            "stage": e.stage.value,
            "receipt_digest": e.receipt.digest if e.receipt else None,
        }
        for e in found
        if e.stage not in OPEN_STAGES
    ]
    approvals = await approval_store.listed(
        connection, tenant_id, run_id=run.run_id, state="", tool="", after_id="", limit=SECTION_ROWS_MAX
    )
    grouped: dict[str, list[dict[str, Any]]] = {"pending": [], "active": [], "denied": []}
    for approval in approvals:
        state = approval.effective_state(unit.now)
        key = {ApprovalState.PENDING: "pending", ApprovalState.APPROVED: "active", ApprovalState.DENIED: "denied"}.get(
            state
        )
        if key is None:
            continue
        grouped[key].append(
            {
                "approval_id": approval.approval_id,
                "tool": approval.tool,
                "tool_revision": approval.tool_revision,
                "target": approval.target,
                "intent_digest": approval.intent_digest,
                "state": state.value,
                "quorum": approval.quorum,
                "reusable": approval.reusable,
                "requested_by": approval.requested_by,
                "expires_at": timestamp_text(approval.expires_at),
                "votes": [
                    {"reviewer_id": v.reviewer_id, "approve": v.approve, "comment": v.comment} for v in approval.votes
                ],
            }
        )
    applicable = await budget_store.applicable_budgets(connection, tenant_id, run.run_id, run.root_run_id, unit.now)
    reservations = await budget_store.open_reservations(
        connection, tenant_id, [b.budget_id for b in applicable], SECTION_ROWS_MAX
    )
    run_attempts = {a.attempt_id for e in found for a in e.attempts}
    open_schedules = await schedule_store.open_of_run(connection, tenant_id, run.run_id, SECTION_SCHEDULES_MAX)
    held_by_schedules = {s.schedule_id for s in open_schedules}
    return {
        "schedules": [s.as_section() for s in open_schedules],
        "effects": {"open": open_effects, "settled": settled},
        "approvals": grouped,
        "budgets": {
            "budgets": [
                {
                    "budget_id": b.budget_id,
                    "scope": b.scope.value,
                    "scope_id": b.scope_id,
                    "dimension": b.dimension,
                    "limit": b.limit,
                    "posted": b.posted,
                    "pending": b.pending,
                }
                for b in applicable
            ],
            "open_reservations": [
                {
                    "reservation_id": r.reservation_id,
                    "budget_id": r.budget_id,
                    "attempt_id": r.attempt_id,
                    "effect_id": r.effect_id,
                    "dimension": r.dimension,
                    "amount": r.amount,
                }
                for r in reservations
                if r.attempt_id in run_attempts or r.attempt_id in held_by_schedules
            ],
        },
        "tools": tools_section,
        "policy": {"revision": await policy.revision(), "engine": policy.name},
    }


# --- seal and register ---------------------------------------------------------------------


@dataclass(frozen=True)
class SealRequest:
    run_id: str
    expected_revision: int
    state_json: bytes
    artifacts: list[ArtifactRef]
    facts: Facts


async def _require_complete(unit: UnitOfWork, tenant_id: str, refs: list[ArtifactRef]) -> None:
    statuses = await store.artifact_statuses(unit.connection, tenant_id, [r.digest for r in refs])
    for ref in refs:
        status = statuses.get(ref.digest)
        if status != ArtifactStatus.COMPLETE:
            raise _refused(
                "ARTIFACT_INCOMPLETE",
                f"artifact/{ref.name}",
                f"artifact {ref.name} ({ref.digest}) is {'unknown' if status is None else status.value}; "
                "an artifact that is not complete cannot be claimed",
                artifact=ref.name,
            )


async def seal(unit: UnitOfWork, principal: Principal, request: SealRequest, policy: PolicyEngine) -> CheckpointRecord:
    """One transaction: check the revision, copy the ledger, compute the manifest, append the event.

    The run row is locked first, so no effect can be appended to the trace between the revision
    check and the copy: a concurrent AuthorizeEffect either committed before (and the revision
    moved: refused) or commits after, at a later revision than this checkpoint's.
    """
    tenant = principal.tenant_id
    check_identifier(request.run_id, "run_id")
    rules.check_facts(request.facts, "facts")
    state = parse_json(request.state_json, field="state_json", size_max_bytes=rules.STATE_SIZE_MAX_BYTES)
    if state.get(LIFETIME_KEY) == "live_continuation":
        raise live_continuation_refused()
    rules.check_artifact_refs(request.artifacts)
    head = await store.lock_run_head(unit.connection, tenant, request.run_id)
    if head is None:
        raise NotFound("run", request.run_id)
    if head.revision != request.expected_revision:
        raise _refused(
            "REVISION_MOVED",
            f"run/{request.run_id}",
            f"the run is at revision {head.revision}, not {request.expected_revision}",
            current_revision=str(head.revision),
        )
    await _require_complete(unit, tenant, request.artifacts)
    run = await repo.get_run(unit.connection, tenant, request.run_id)
    assert run is not None, "the run's head was locked above"
    ledger = await ledger_sections(unit, tenant, run, policy)
    checkpoint_id = repo.new_id("chk")
    manifest = rules.build_manifest(
        tenant_id=tenant,
        run_id=run.run_id,
        checkpoint_id=checkpoint_id,
        revision=head.revision,
        state=state,
        artifacts=request.artifacts,
        ledger=ledger,
        policy_revision=ledger["policy"]["revision"],
        sealed_at=timestamp_text(unit.now),
    )
    record = CheckpointRecord(
        checkpoint_id=checkpoint_id,
        run_id=run.run_id,
        revision=head.revision,
        status="SEALED",
        format_version=rules.FORMAT_VERSION,
        state=state,
        artifacts=request.artifacts,
        ledger=ledger,
        manifest=manifest,
        manifest_digest=rules.section_digest(manifest),
        facts=request.facts,
        policy_revision=ledger["policy"]["revision"],
        sealed_by=principal.principal_id,
        sealed_at=unit.now,
    )
    await store.insert_checkpoint(unit.connection, tenant, record)
    unit.record_event(
        tenant,
        run.run_id,
        "checkpoint.sealed",
        {
            "checkpoint_id": checkpoint_id,
            "manifest_digest": record.manifest_digest,
            "at_revision": head.revision,
            "open_effects": [e["effect_id"] for e in ledger["effects"]["open"]],
        },
        principal.principal_id,
    )
    return record


async def _checkpoint(
    unit: UnitOfWork, principal: Principal, checkpoint_id: str, *, lock: bool = False
) -> CheckpointRecord:
    check_identifier(checkpoint_id, "checkpoint_id")
    record = await store.get_checkpoint(unit.connection, principal.tenant_id, checkpoint_id, lock=lock)
    if record is None:
        raise NotFound("checkpoint", checkpoint_id)
    return record


async def register(unit: UnitOfWork, principal: Principal, checkpoint_id: str, facts: Facts | None) -> CheckpointRecord:
    """Validate schema version, digests and ownership; freeze the record with its facts."""
    if facts is not None:
        rules.check_facts(facts, "facts")
    record = await _checkpoint(unit, principal, checkpoint_id, lock=True)
    facts = facts or record.facts
    if record.status == "REGISTERED":
        if facts.as_json() == record.facts.as_json():
            return record
        raise _refused("ALREADY_REGISTERED", f"checkpoint/{checkpoint_id}", "a registered checkpoint is frozen")
    if record.format_version != rules.FORMAT_VERSION:
        raise _refused(
            "FORMAT_NOT_CURRENT",
            f"checkpoint/{checkpoint_id}",
            f"format {record.format_version} must be migrated first (import derives a current checkpoint)",
        )
    if record.manifest.get("tenant_id") != principal.tenant_id or record.manifest.get("run_id") != record.run_id:
        raise _refused("OWNERSHIP_MISMATCH", f"checkpoint/{checkpoint_id}", "the manifest names another tenant or run")
    problems = rules.manifest_problems(record.manifest, record.state, record.ledger, record.artifacts)
    if problems or rules.section_digest(record.manifest) != record.manifest_digest:
        component = problems[0] if problems else "manifest"
        raise _refused(
            "DIGEST_MISMATCH", f"checkpoint/{checkpoint_id}/{component}", f"{component} does not match its digest"
        )
    if not record.policy_revision:
        raise _refused(
            "POLICY_IDENTITY_MISSING", f"checkpoint/{checkpoint_id}", "the checkpoint names no policy revision"
        )
    await _require_complete(
        unit, principal.tenant_id, [r for r in record.artifacts if r.classification == rules.ArtifactClass.REQUIRED]
    )
    await store.register(unit.connection, principal.tenant_id, checkpoint_id, facts, principal.principal_id, unit.now)
    unit.record_event(
        principal.tenant_id,
        record.run_id,
        "checkpoint.registered",
        {"checkpoint_id": checkpoint_id, "facts": facts.as_json()},
        principal.principal_id,
    )
    return await _checkpoint(unit, principal, checkpoint_id)


async def get(unit: UnitOfWork, principal: Principal, checkpoint_id: str) -> CheckpointRecord:
    return await _checkpoint(unit, principal, checkpoint_id)


async def list_for_run(
    unit: UnitOfWork, principal: Principal, run_id: str, after_id: str, limit: int
) -> list[CheckpointRecord]:
    check_identifier(run_id, "run_id")
    if await repo.get_run(unit.connection, principal.tenant_id, run_id) is None:
        raise NotFound("run", run_id)
    return await store.list_checkpoints(unit.connection, principal.tenant_id, run_id, after_id, limit)


# --- compatibility, resume, fork -----------------------------------------------------------


async def check(
    unit: UnitOfWork, principal: Principal, checkpoint_id: str, current: Facts
) -> rules.CompatibilityVerdict:
    rules.check_facts(current, "current")
    record = await _checkpoint(unit, principal, checkpoint_id)
    statuses = await store.artifact_statuses(unit.connection, principal.tenant_id, [r.digest for r in record.artifacts])
    recorded_open = [e["effect_id"] for e in record.ledger.get("effects", {}).get("open", [])]
    unresolved = []
    for effect_id in recorded_open:
        effect = await repo.effect_by_id(unit.connection, principal.tenant_id, effect_id)
        if effect is None:
            unresolved.append(effect_id)
            continue
        expired_in_memory(effect, unit.now)
        if effect.stage == Stage.UNKNOWN:
            unresolved.append(effect_id)
    return rules.compatibility(
        registered=record.status == "REGISTERED",
        recorded=record.facts,
        current=current,
        policy_revision=record.policy_revision,
        artifacts=record.artifacts,
        artifact_status=statuses,
        unresolved_effects=unresolved,
        removed_by_retention=await retention.removed_artifacts(unit, principal.tenant_id, statuses),
    )


@dataclass(frozen=True)
class ResumeResult:
    run_id: str
    revision: int
    segment: int
    open_effects: list[Effect]
    verdict: rules.CompatibilityVerdict


async def resume(
    unit: UnitOfWork,
    principal: Principal,
    checkpoint_id: str,
    configuration: tuple[str, str, str],
    reason: str,
    current: Facts,
    context_manifest_digest: str,
) -> ResumeResult:
    """Continue the same run under a new configuration: knowledge restored, authority current."""
    check_text(reason, "reason", required=True, lines=True)
    for field, value in zip(
        ("configuration.provider", "configuration.model", "configuration.adapter"), configuration, strict=True
    ):
        check_text(value, field, required=False, length_max=128)
    if context_manifest_digest:
        rules.check_digest(context_manifest_digest, "context_manifest_digest")
    verdict = await check(unit, principal, checkpoint_id, current)
    record = await _checkpoint(unit, principal, checkpoint_id)
    if verdict.verdict == Verdict.INCOMPATIBLE:
        first = next(p for p in verdict.problems if not p.degraded_only)
        raise FailedPrecondition(
            f"checkpoint {checkpoint_id} is not resumable: {first.fact}: {first.reason}",
            reason="CHECKPOINT_INCOMPATIBLE",
            violations=[
                PreconditionViolation("INCOMPATIBLE", p.fact, p.reason) for p in verdict.problems if not p.degraded_only
            ],
            metadata={"checkpoint_id": checkpoint_id},
        )
    head = await store.lock_run_head(unit.connection, principal.tenant_id, record.run_id)
    assert head is not None, "a checkpoint's run exists"
    segment = head.segment + 1
    open_effects = [
        e
        for e in await repo.run_effects(unit.connection, principal.tenant_id, record.run_id, SECTION_ROWS_MAX)
        if e.stage in OPEN_STAGES
    ]
    for effect in open_effects:
        expired_in_memory(effect, unit.now)
    await store.add_obligations(
        unit.connection,
        principal.tenant_id,
        record.run_id,
        [e.effect_id for e in open_effects],
        checkpoint_id,
        unit.now,
    )
    await store.set_configuration(unit.connection, principal.tenant_id, record.run_id, segment, configuration)
    carried = await schedules.carry_over(unit, principal, record.run_id, record.ledger.get("schedules", []))
    unit.record_event(
        principal.tenant_id,
        record.run_id,
        "run.configuration_transition",
        {
            "old": {"provider": head.provider, "model": head.model, "adapter": head.adapter, "segment": head.segment},
            "new": {
                "provider": configuration[0],
                "model": configuration[1],
                "adapter": configuration[2],
                "segment": segment,
            },
            "reason": reason,
            "checkpoint_id": checkpoint_id,
            "context_manifest_digest": context_manifest_digest,
            "verdict": verdict.verdict.value,
            "open_effects": [e.effect_id for e in open_effects],
            "schedules": carried,
        },
        principal.principal_id,
    )
    revision = await unit.flush_events_for(principal.tenant_id, record.run_id)
    return ResumeResult(record.run_id, revision, segment, open_effects, verdict)


async def fork(unit: UnitOfWork, principal: Principal, checkpoint_id: str, world: str, difference: str) -> Any:
    check_text(difference, "difference", required=True, lines=True)
    record = await _checkpoint(unit, principal, checkpoint_id)
    if record.status != "REGISTERED":
        raise _refused("NOT_REGISTERED", f"checkpoint/{checkpoint_id}", "only a registered checkpoint can be forked")
    parent = await repo.get_run(unit.connection, principal.tenant_id, record.run_id)
    assert parent is not None, "a checkpoint's run exists"
    run_id = repo.new_id("run")
    await repo.insert_run(
        unit.connection,
        tenant_id=principal.tenant_id,
        run_id=run_id,
        created_by=principal.principal_id,
        now=unit.now,
        labels=parent.labels,
        request_id=None,
        parent_run_id=parent.run_id,
        root_run_id=parent.root_run_id,
        world=world,
        forked_from_checkpoint=checkpoint_id,
        configuration=(parent.provider, parent.model, parent.adapter),
    )
    unit.record_event(
        principal.tenant_id,
        run_id,
        "run.forked",
        {
            "parent_run_id": parent.run_id,
            "checkpoint_id": checkpoint_id,
            "at_revision": record.revision,
            "world": world,
            "difference": difference,
        },
        principal.principal_id,
    )
    unit.record_event(
        principal.tenant_id,
        parent.run_id,
        "run.fork_created",
        {"child_run_id": run_id, "checkpoint_id": checkpoint_id, "world": world, "difference": difference},
        principal.principal_id,
    )
    return run_id, parent.run_id


# --- export and import ---------------------------------------------------------------------


@dataclass(frozen=True)
class KeySettings:
    """Checkpoint keys from the server's settings, beside those kept in the database.

    ``signer``: a key pair that signs exports instead of the database's active key
    (``--checkpoint-signing-key``); ``trusted``: public keys whose signatures imports accept, in
    addition to every key in the database (``--checkpoint-verification-key``), by key id.
    """

    signer: signing.KeyPair | None = None
    trusted: dict[str, str] | None = None


async def signing_key(unit: UnitOfWork, settings: KeySettings) -> signing.KeyPair:
    """The key that signs an export: the configured one, else the deployment's active key
    (generated and kept in the database when there is none yet)."""
    if settings.signer is not None:
        return settings.signer
    row = await key_store.ensure_signing_key(unit.connection, unit.now)
    assert row.private_key is not None
    return signing.KeyPair(row.key_id, row.public_key, row.private_key)


async def trusted_keys(unit: UnitOfWork, settings: KeySettings) -> dict[str, str]:
    keys = {row.key_id: row.public_key for row in await key_store.list_keys(unit.connection)}
    if settings.signer is not None:
        keys[settings.signer.key_id] = settings.signer.public_pem
    keys.update(settings.trusted or {})
    return keys


def export_archive(record: CheckpointRecord, key: signing.KeyPair | None) -> bytes:
    files = rules.archive_files(record.manifest, record.state, record.ledger, record.artifacts)
    manifest = rules.export_manifest(record.manifest, files)
    manifest_bytes = canonical_bytes(manifest)
    files["manifest.json"] = manifest_bytes
    return rules.build_archive(files, signing.sign(key.private_pem, manifest_bytes) if key is not None else None)


@dataclass(frozen=True)
class CheckedArchive:
    """An archive verified before the import's unit of work, for ``tenant_id``, against
    ``trusted`` (the keys the deployment trusted then)."""

    verified: rules.VerifiedArchive
    tenant_id: str
    trusted: dict[str, str]


def _verify_import(
    data: bytes, tenant_id: str, trusted: dict[str, str], expected_manifest_digest: str, allow_unsigned: bool
) -> rules.VerifiedArchive:
    if expected_manifest_digest:
        rules.check_digest(expected_manifest_digest, "expected_manifest_digest")
    return rules.verify_archive(
        data,
        tenant_id=tenant_id,
        trusted_keys=trusted,
        allow_unsigned=allow_unsigned,
        expected_manifest_digest=expected_manifest_digest,
    )


async def check_archive(
    database: Database,
    tenant_id: str,
    data: bytes,
    keys: KeySettings,
    expected_manifest_digest: str = "",
    allow_unsigned: bool = False,
) -> CheckedArchive:
    """Verify an archive before its import's unit of work, on a thread: parsing a large one
    takes a second or more of pure Python, which would otherwise hold the event loop (every
    other call of the process) and, inside the unit, the database (SQLite's one write lock).
    On the thread the event loop still runs between the interpreter's switches. Raises the
    refusal ``import_archive`` would raise."""
    trusted = await database.run(lambda unit: trusted_keys(unit, keys), read_clock=False)
    verified = await asyncio.to_thread(
        _verify_import, data, tenant_id, trusted, expected_manifest_digest, allow_unsigned
    )
    return CheckedArchive(verified, tenant_id, trusted)


async def import_archive(
    unit: UnitOfWork,
    principal: Principal,
    data: bytes,
    keys: KeySettings,
    expected_manifest_digest: str = "",
    allow_unsigned: bool = False,
    checked: CheckedArchive | None = None,
) -> CheckpointRecord:
    """Verify everything first; then write the run (if new), the checkpoint, and a derived
    current-format checkpoint when the archive is of an older format.

    An archive whose manifest a trusted key signed imports for agents and admins, into a new run
    or beside the run's own checkpoints. Any other archive (unsigned, or signed by a key this
    deployment does not trust) is refused, unless an admin asks for it explicitly
    (``allow_unsigned``), and even then only as a new run: it never attaches to an existing one.

    ``checked``: the archive as ``check_archive`` verified it before this unit; it stands when it
    was verified for this tenant against the keys trusted now (otherwise it is verified again).
    """
    trusted = await trusted_keys(unit, keys)
    if checked is not None and checked.tenant_id == principal.tenant_id and checked.trusted == trusted:
        verified = checked.verified
    else:
        verified = _verify_import(data, principal.tenant_id, trusted, expected_manifest_digest, allow_unsigned)
    signer = verified.signer
    run_id = verified.manifest["run_id"]
    check_identifier(run_id, "manifest.json: run_id")
    if signer is None:
        # Asked for explicitly (verify_archive refuses otherwise): an admin's import of an
        # archive no trusted key signed, as a new run only.
        what = "is signed by no key this deployment trusts" if verified.signed else "is not signed"
        if not principal.has_any(frozenset({Role.ADMIN})):
            raise PermissionDenied(
                f"the archive {what}: only an admin may import it (allow_unsigned)",
                reason="UNSIGNED_IMPORT_NEEDS_ADMIN",
                metadata={"principal_id": principal.principal_id, "component": rules.SIGNATURE_FILE},
            )
        if await repo.get_run(unit.connection, principal.tenant_id, run_id) is not None:
            raise FailedPrecondition(
                f"the archive {what}: it may only create a new run, and run {run_id} exists",
                reason="UNSIGNED_IMPORT_INTO_EXISTING_RUN",
                violations=[
                    PreconditionViolation("UNSIGNED_IMPORT_INTO_EXISTING_RUN", "manifest.json: run_id", run_id)
                ],
                metadata={"run_id": run_id, "component": "manifest.json"},
            )
    manifest = verified.manifest
    ledger, notes = rules.migrate_to_current(manifest, verified.ledger)
    tenant = principal.tenant_id
    digest = rules.section_digest({**manifest})
    if await repo.get_run(unit.connection, tenant, run_id) is None:
        await repo.insert_run(
            unit.connection,
            tenant_id=tenant,
            run_id=run_id,
            created_by=principal.principal_id,
            now=unit.now,
            labels={},
            request_id=None,
        )
        unit.record_event(
            tenant,
            run_id,
            "run.imported",
            {"manifest_digest": digest, "checkpoint_id": manifest["checkpoint_id"], "signed_by": signer or ""},
            principal.principal_id,
        )
    original = CheckpointRecord(
        checkpoint_id=repo.new_id("chk"),
        run_id=run_id,
        revision=int(manifest["revision"]),
        status="SEALED",
        format_version=int(manifest["format_version"]),
        state=verified.state,
        artifacts=verified.artifacts,
        ledger=verified.ledger,
        manifest=manifest,
        manifest_digest=digest,
        facts=Facts(),
        policy_revision=str(manifest.get("policy_revision", "")),
        sealed_by=principal.principal_id,
        sealed_at=unit.now,
        imported_from_digest=digest,
    )
    await store.insert_checkpoint(unit.connection, tenant, original)
    unit.record_event(
        tenant,
        run_id,
        "checkpoint.imported",
        {
            "checkpoint_id": original.checkpoint_id,
            "manifest_digest": digest,
            "format_version": original.format_version,
            "signed_by": signer or "",
        },
        principal.principal_id,
    )
    if original.format_version == rules.FORMAT_VERSION:
        return original
    derived_id = repo.new_id("chk")
    derived_manifest = rules.build_manifest(
        tenant_id=tenant,
        run_id=run_id,
        checkpoint_id=derived_id,
        revision=original.revision,
        state=verified.state,
        artifacts=verified.artifacts,
        ledger=ledger,
        policy_revision=original.policy_revision,
        sealed_at=timestamp_text(unit.now),
    )
    derived = CheckpointRecord(
        checkpoint_id=derived_id,
        run_id=run_id,
        revision=original.revision,
        status="SEALED",
        format_version=rules.FORMAT_VERSION,
        state=verified.state,
        artifacts=verified.artifacts,
        ledger=ledger,
        manifest=derived_manifest,
        manifest_digest=rules.section_digest(derived_manifest),
        facts=Facts(),
        policy_revision=original.policy_revision,
        sealed_by=principal.principal_id,
        sealed_at=unit.now,
        derived_from=original.checkpoint_id,
        imported_from_digest=digest,
    )
    await store.insert_checkpoint(unit.connection, tenant, derived)
    unit.record_event(
        tenant,
        run_id,
        "checkpoint.migrated",
        {
            "checkpoint_id": derived_id,
            "derived_from": original.checkpoint_id,
            "from_format": original.format_version,
            "to_format": rules.FORMAT_VERSION,
            "notes": notes,
        },
        principal.principal_id,
    )
    return derived


# --- artifacts and sibling lifetimes -------------------------------------------------------


async def _stored(unit: UnitOfWork, principal: Principal, digest: str) -> store.ArtifactRow:
    row = await store.get_artifact(unit.connection, principal.tenant_id, digest)
    assert row is not None, "stored in this transaction"
    return row


async def _artifact_quota(unit: UnitOfWork, principal: Principal, quota: int) -> None:
    if await store.stored_artifacts(unit.connection, principal.tenant_id, quota) >= quota:
        raise quotas.exceeded("stored_artifacts", principal.tenant_id, quota, "delete artifacts no checkpoint needs")


async def put_artifact(
    unit: UnitOfWork, principal: Principal, content: bytes, media_type: str, quota: int
) -> store.ArtifactRow:
    if len(content) > ARTIFACT_CONTENT_MAX_BYTES:
        raise InvalidArgument.field(
            "content", f"at most {ARTIFACT_CONTENT_MAX_BYTES} bytes; declare larger artifacts", reason="TOO_LARGE"
        )
    check_text(media_type, "media_type", required=False, length_max=128)
    digest = rules.content_digest(content)
    existing = await store.get_artifact(unit.connection, principal.tenant_id, digest, lock=True)
    if existing is None or existing.status == ArtifactStatus.TOMBSTONE:
        await _artifact_quota(unit, principal, quota)
    if existing is None:
        await store.put_artifact(
            unit.connection,
            principal.tenant_id,
            digest=digest,
            size_bytes=len(content),
            media_type=media_type,
            status=ArtifactStatus.COMPLETE,
            location="",
            content=content,
            now=unit.now,
        )
    elif existing.status != ArtifactStatus.COMPLETE:
        await store.set_artifact(
            unit.connection,
            principal.tenant_id,
            digest,
            unit.now,
            status=ArtifactStatus.COMPLETE.value,
            content=content,
            size_bytes=len(content),
        )
    return await _stored(unit, principal, digest)


async def declare_artifact(
    unit: UnitOfWork, principal: Principal, digest: str, size_bytes: int, media_type: str, location: str, quota: int
) -> store.ArtifactRow:
    rules.check_digest(digest, "digest")
    if size_bytes < 0:
        raise InvalidArgument.field("size_bytes", "must not be negative")
    check_text(media_type, "media_type", required=False, length_max=128)
    check_text(location, "location", required=False, length_max=1024)
    parts = urlsplit(location)
    if parts.username or parts.password:
        raise InvalidArgument.field("location", "must not carry credentials", reason="CREDENTIALS_REFUSED")
    existing = await store.get_artifact(unit.connection, principal.tenant_id, digest)
    if existing is None:
        await _artifact_quota(unit, principal, quota)
        await store.put_artifact(
            unit.connection,
            principal.tenant_id,
            digest=digest,
            size_bytes=size_bytes,
            media_type=media_type,
            status=ArtifactStatus.PENDING,
            location=location,
            content=None,
            now=unit.now,
        )
    return await _stored(unit, principal, digest)


async def set_artifact_status(
    unit: UnitOfWork, principal: Principal, digest: str, status: ArtifactStatus
) -> store.ArtifactRow:
    rules.check_digest(digest, "digest")
    existing = await store.get_artifact(unit.connection, principal.tenant_id, digest, lock=True)
    if existing is None:
        raise NotFound("artifact", digest)
    values: dict[str, Any] = {"status": status.value}
    if status == ArtifactStatus.TOMBSTONE:
        values["content"] = None
    elif existing.status == ArtifactStatus.TOMBSTONE:
        removed = await retention.removed_artifacts(unit, principal.tenant_id, {digest: existing.status})
        raise _refused(
            "ARTIFACT_DELETED",
            f"artifact/{digest}",
            f"a deleted artifact cannot be completed again; put its content ({removed.get(digest, 'deleted')})",
            **({"removed_by_retention": removed[digest]} if digest in removed else {}),
        )
    await store.set_artifact(unit.connection, principal.tenant_id, digest, unit.now, **values)
    return await _stored(unit, principal, digest)


async def _require_run(unit: UnitOfWork, principal: Principal, run_id: str) -> None:
    check_identifier(run_id, "run_id")
    if await repo.get_run(unit.connection, principal.tenant_id, run_id) is None:
        raise NotFound("run", run_id)


async def record_snapshot(
    unit: UnitOfWork, principal: Principal, run_id: str, value_json: bytes, quota: int
) -> dict[str, Any]:
    await _require_run(unit, principal, run_id)
    value = parse_json(value_json, field="value_json", size_max_bytes=rules.STATE_SIZE_MAX_BYTES, require_object=False)
    if isinstance(value, dict) and value.get(LIFETIME_KEY) == "live_continuation":
        raise live_continuation_refused()
    if await store.recorded_snapshots(unit.connection, principal.tenant_id, quota) >= quota:
        raise quotas.exceeded("recorded_snapshots", principal.tenant_id, quota, "snapshots are kept with their runs")
    snapshot_id = repo.new_id("snp")
    await store.insert_snapshot(
        unit.connection,
        principal.tenant_id,
        snapshot_id=snapshot_id,
        run_id=run_id,
        value=value,
        created_by=principal.principal_id,
        created_at=unit.now,
    )
    return {"snapshot_id": snapshot_id, "run_id": run_id, "value": value, "created_at": unit.now}


async def record_provider_session(
    unit: UnitOfWork,
    principal: Principal,
    run_id: str,
    provider: str,
    session_id: str,
    response_id: str,
    expires_at: datetime | None,
) -> dict[str, Any]:
    await _require_run(unit, principal, run_id)
    check_text(provider, "provider", required=True, length_max=128)
    check_text(session_id, "session_id", required=True, length_max=512)
    check_text(response_id, "response_id", required=False, length_max=512)
    reference_id = repo.new_id("psr")
    await store.insert_provider_session(
        unit.connection,
        principal.tenant_id,
        reference_id=reference_id,
        run_id=run_id,
        provider=provider,
        session_id=session_id,
        response_id=response_id,
        expires_at=expires_at,
        observed_at=unit.now,
    )
    unit.record_event(
        principal.tenant_id,
        run_id,
        "adapter.provider_session_observed",
        {"reference_id": reference_id, "provider": provider, "session_id": session_id, "response_id": response_id},
        principal.principal_id,
    )
    return {
        "reference_id": reference_id,
        "run_id": run_id,
        "provider": provider,
        "session_id": session_id,
        "response_id": response_id,
        "expires_at": expires_at,
        "observed_at": unit.now,
    }


async def record_execution_handle(
    unit: UnitOfWork, principal: Principal, run_id: str, runtime: str, handle: str
) -> dict[str, Any]:
    await _require_run(unit, principal, run_id)
    check_text(runtime, "runtime", required=True, length_max=128)
    check_text(handle, "handle", required=True, length_max=512)
    handle_id = repo.new_id("hdl")
    await store.insert_execution_handle(
        unit.connection,
        principal.tenant_id,
        handle_id=handle_id,
        run_id=run_id,
        runtime=runtime,
        handle=handle,
        created_at=unit.now,
    )
    return {"handle_id": handle_id, "run_id": run_id, "runtime": runtime, "handle": handle, "created_at": unit.now}
