"""The Checkpoints servicer."""

from __future__ import annotations

from pathlib import Path

from effect_ledger.domain import checkpoints as rules
from effect_ledger.domain import signing
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.checkpoints import ArtifactClass, ArtifactRef, ArtifactStatus, Facts
from effect_ledger.errors import InvalidArgument, LedgerError
from effect_ledger.policy.engine import PolicyEngine
from effect_ledger.service import checkpoints
from effect_ledger.storage.checkpoint_store import ArtifactRow, CheckpointRecord
from effect_ledger.transport import mapping, roles, status
from effect_ledger.transport.servicers import Application, encode_token
from effectledger.v1 import checkpoints_pb2, checkpoints_pb2_grpc

CHUNK_BYTES = 64 * 1024


def load_signing_key(path: str) -> signing.KeyPair | None:
    """An Ed25519 private key (PEM, unencrypted) that signs exports instead of the key kept in
    the database."""
    if not path:
        return None
    try:
        return signing.private_key(Path(path).read_bytes(), source=path)
    except (OSError, InvalidArgument) as error:
        raise SystemExit(f"--checkpoint-signing-key: {error}") from None


def load_verification_key(path: str) -> dict[str, str]:
    """An Ed25519 public key (PEM) whose signatures imports accept, beside the database's keys."""
    if not path:
        return {}
    try:
        key_id, pem = signing.public_key(Path(path).read_bytes(), source=path)
    except (OSError, InvalidArgument) as error:
        raise SystemExit(f"--checkpoint-verification-key: {error}") from None
    return {key_id: pem}


def facts_from_proto(message: checkpoints_pb2.CompatibilityFacts) -> Facts:
    return Facts(
        runtime=message.runtime,
        contract_schema=message.contract_schema,
        code_version=message.code_version,
        checkpoint_format=message.checkpoint_format,
        native_references=tuple(message.native_references),
        recorded_effects=tuple(message.recorded_effects),
    )


def facts_to_proto(facts: Facts) -> checkpoints_pb2.CompatibilityFacts:
    return checkpoints_pb2.CompatibilityFacts(
        runtime=facts.runtime,
        contract_schema=facts.contract_schema,
        code_version=facts.code_version,
        checkpoint_format=facts.checkpoint_format,
        native_references=list(facts.native_references),
        recorded_effects=list(facts.recorded_effects),
    )


def ref_from_proto(message: checkpoints_pb2.ArtifactRef, index: int) -> ArtifactRef:
    classification = mapping.enum_value(
        checkpoints_pb2.ArtifactClass, message.classification, f"artifacts[{index}].classification", ArtifactClass
    )
    return ArtifactRef(message.name, message.digest, classification)


def checkpoint_to_proto(record: CheckpointRecord) -> checkpoints_pb2.Checkpoint:
    return checkpoints_pb2.Checkpoint(
        checkpoint_id=record.checkpoint_id,
        run_id=record.run_id,
        revision=record.revision,
        status=checkpoints_pb2.CheckpointStatus.Value(record.status),
        format_version=record.format_version,
        state_json=canonical_bytes(record.state),
        artifacts=[
            checkpoints_pb2.ArtifactRef(
                name=r.name, digest=r.digest, classification=checkpoints_pb2.ArtifactClass.Value(r.classification.value)
            )
            for r in record.artifacts
        ],
        manifest_json=canonical_bytes(record.manifest),
        manifest_digest=record.manifest_digest,
        ledger_json=canonical_bytes(record.ledger),
        facts=facts_to_proto(record.facts),
        sealed_by=record.sealed_by,
        sealed_at=mapping.timestamp(record.sealed_at),
        registered_by=record.registered_by or "",
        registered_at=mapping.timestamp(record.registered_at),
        derived_from=record.derived_from or "",
        imported_from_digest=record.imported_from_digest or "",
        policy_revision=record.policy_revision,
    )


def artifact_to_proto(row: ArtifactRow) -> checkpoints_pb2.Artifact:
    return checkpoints_pb2.Artifact(
        digest=row.digest,
        size_bytes=row.size_bytes,
        media_type=row.media_type,
        status=checkpoints_pb2.ArtifactStatus.Value(f"ARTIFACT_{row.status.value}"),
        location=row.location,
        created_at=mapping.timestamp(row.created_at),
        updated_at=mapping.timestamp(row.updated_at),
    )


def verdict_to_proto(verdict: rules.CompatibilityVerdict) -> checkpoints_pb2.CompatibilityVerdict:
    return checkpoints_pb2.CompatibilityVerdict(
        verdict=checkpoints_pb2.Verdict.Value(verdict.verdict.value),
        facts=[
            checkpoints_pb2.IncompatibleFact(fact=p.fact, reason=p.reason, degraded_only=p.degraded_only)
            for p in verdict.problems
        ],
    )


class CheckpointsServicer(checkpoints_pb2_grpc.CheckpointsServicer):
    def __init__(
        self,
        app: Application,
        policy: PolicyEngine,
        keys: checkpoints.KeySettings | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self.keys = keys or checkpoints.KeySettings()

    async def SealCheckpoint(self, request, context):
        command = checkpoints.SealRequest(
            run_id=request.run_id,
            expected_revision=request.expected_revision,
            state_json=request.state_json,
            artifacts=[ref_from_proto(r, i) for i, r in enumerate(request.artifacts)],
            facts=facts_from_proto(request.facts),
        )
        record = await self.app.call(
            context,
            roles.of("Checkpoints", "SealCheckpoint"),
            lambda unit, principal: checkpoints.seal(unit, principal, command, self.policy),
        )
        return checkpoint_to_proto(record)

    async def RegisterCheckpoint(self, request, context):
        facts = facts_from_proto(request.facts) if request.HasField("facts") else None
        record = await self.app.call(
            context,
            roles.of("Checkpoints", "RegisterCheckpoint"),
            lambda unit, principal: checkpoints.register(unit, principal, request.checkpoint_id, facts),
        )
        return checkpoint_to_proto(record)

    async def GetCheckpoint(self, request, context):
        record = await self.app.call(
            context,
            roles.of("Checkpoints", "GetCheckpoint"),
            lambda unit, principal: checkpoints.get(unit, principal, request.checkpoint_id),
        )
        return checkpoint_to_proto(record)

    async def ListCheckpoints(self, request, context):
        size, after = self.app.page(request)
        found = await self.app.call(
            context,
            roles.of("Checkpoints", "ListCheckpoints"),
            lambda unit, principal: checkpoints.list_for_run(unit, principal, request.run_id, after, size),
        )
        return checkpoints_pb2.ListCheckpointsResponse(
            checkpoints=[checkpoint_to_proto(r) for r in found],
            next_page_token=encode_token(found[-1].checkpoint_id) if len(found) == size else "",
        )

    async def CheckResumeCompatibility(self, request, context):
        current = facts_from_proto(request.current)
        verdict = await self.app.call(
            context,
            roles.of("Checkpoints", "CheckResumeCompatibility"),
            lambda unit, principal: checkpoints.check(unit, principal, request.checkpoint_id, current),
        )
        return verdict_to_proto(verdict)

    async def ResumeRun(self, request, context):
        configuration = (request.configuration.provider, request.configuration.model, request.configuration.adapter)
        current = facts_from_proto(request.current)
        result = await self.app.call(
            context,
            roles.of("Checkpoints", "ResumeRun"),
            lambda unit, principal: checkpoints.resume(
                unit,
                principal,
                request.checkpoint_id,
                configuration,
                request.reason,
                current,
                request.context_manifest_digest,
            ),
        )
        return checkpoints_pb2.ResumeRunResponse(
            run_id=result.run_id,
            revision=result.revision,
            segment=result.segment,
            open_effects=[
                checkpoints_pb2.OpenEffect(
                    effect_id=e.effect_id,
                    tool=e.tool,
                    target=e.target,
                    idempotency_key=e.idempotency_key,
                    stage=e.stage.value,
                    tool_revision=e.tool_revision,
                )
                for e in result.open_effects
            ],
            verdict=verdict_to_proto(result.verdict),
        )

    async def ForkRun(self, request, context):
        world = mapping.enum_value(checkpoints_pb2.World, request.world, "world")
        run_id, parent = await self.app.call(
            context,
            roles.of("Checkpoints", "ForkRun"),
            lambda unit, principal: checkpoints.fork(unit, principal, request.checkpoint_id, world, request.difference),
        )
        return checkpoints_pb2.ForkRunResponse(run_id=run_id, parent_run_id=parent, world=request.world)

    async def ExportCheckpoint(self, request, context):
        try:

            async def work(unit, principal):
                record = await checkpoints.get(unit, principal, request.checkpoint_id)
                return record, await checkpoints.signing_key(unit, self.keys)

            record, key = await self.app.call(context, roles.of("Checkpoints", "ExportCheckpoint"), work)
        except LedgerError as error:
            await context.abort_with_status(status.to_status(error))
        data = checkpoints.export_archive(record, key)
        for offset in range(0, len(data), CHUNK_BYTES):
            yield checkpoints_pb2.ArchiveChunk(data=data[offset : offset + CHUNK_BYTES])

    async def ImportCheckpoint(self, request_iterator, context):
        received = bytearray()
        expected = ""
        allow_unsigned = False
        async for chunk in request_iterator:
            received.extend(chunk.data)
            allow_unsigned = allow_unsigned or chunk.allow_unsigned
            if chunk.expected_manifest_digest:
                if expected and chunk.expected_manifest_digest != expected:
                    await context.abort_with_status(
                        status.to_status(
                            InvalidArgument.field(
                                "expected_manifest_digest", "chunks name different digests", reason="ARCHIVE_INVALID"
                            )
                        )
                    )
                expected = chunk.expected_manifest_digest
            if len(received) > rules.ARCHIVE_SIZE_MAX_BYTES:
                await context.abort_with_status(
                    status.to_status(
                        InvalidArgument.field(
                            "archive", f"is larger than {rules.ARCHIVE_SIZE_MAX_BYTES} bytes", reason="ARCHIVE_INVALID"
                        )
                    )
                )
        data = bytes(received)
        try:
            # Verified before the unit of work, off the event loop, once the caller is known to
            # hold the role (service/checkpoints.py: check_archive).
            principal = await self.app.caller_holding(context, roles.of("Checkpoints", "ImportCheckpoint"))
            checked = None
            if principal is not None:
                checked = await checkpoints.check_archive(
                    self.app.database, principal.tenant_id, data, self.keys, expected, allow_unsigned
                )
            record = await self.app.call(
                context,
                roles.of("Checkpoints", "ImportCheckpoint"),
                lambda unit, principal: checkpoints.import_archive(
                    unit, principal, data, self.keys, expected, allow_unsigned, checked
                ),
            )
        except LedgerError as error:
            await context.abort_with_status(status.to_status(error))
        return checkpoint_to_proto(record)

    async def PutArtifact(self, request, context):
        row = await self.app.call(
            context,
            roles.of("Checkpoints", "PutArtifact"),
            lambda unit, principal: checkpoints.put_artifact(
                unit, principal, request.content, request.media_type, self.app.limits.artifacts_per_tenant_max
            ),
        )
        return artifact_to_proto(row)

    async def DeclareArtifact(self, request, context):
        row = await self.app.call(
            context,
            roles.of("Checkpoints", "DeclareArtifact"),
            lambda unit, principal: checkpoints.declare_artifact(
                unit,
                principal,
                request.digest,
                request.size_bytes,
                request.media_type,
                request.location,
                self.app.limits.artifacts_per_tenant_max,
            ),
        )
        return artifact_to_proto(row)

    async def CompleteArtifact(self, request, context):
        row = await self.app.call(
            context,
            roles.of("Checkpoints", "CompleteArtifact"),
            lambda unit, principal: checkpoints.set_artifact_status(
                unit, principal, request.digest, ArtifactStatus.COMPLETE
            ),
        )
        return artifact_to_proto(row)

    async def DeleteArtifact(self, request, context):
        row = await self.app.call(
            context,
            roles.of("Checkpoints", "DeleteArtifact"),
            lambda unit, principal: checkpoints.set_artifact_status(
                unit, principal, request.digest, ArtifactStatus.TOMBSTONE
            ),
        )
        return artifact_to_proto(row)

    async def RecordSnapshot(self, request, context):
        snapshot = await self.app.call(
            context,
            roles.of("Checkpoints", "RecordSnapshot"),
            lambda unit, principal: checkpoints.record_snapshot(
                unit, principal, request.run_id, request.value_json, self.app.limits.snapshots_per_tenant_max
            ),
        )
        return checkpoints_pb2.Snapshot(
            snapshot_id=snapshot["snapshot_id"],
            run_id=snapshot["run_id"],
            value_json=canonical_bytes(snapshot["value"]),
            created_at=mapping.timestamp(snapshot["created_at"]),
        )

    async def RecordProviderSession(self, request, context):
        expires_at = (
            mapping.time_from_proto(request.expires_at, "expires_at") if request.HasField("expires_at") else None
        )
        reference = await self.app.call(
            context,
            roles.of("Checkpoints", "RecordProviderSession"),
            lambda unit, principal: checkpoints.record_provider_session(
                unit, principal, request.run_id, request.provider, request.session_id, request.response_id, expires_at
            ),
        )
        return checkpoints_pb2.ProviderSessionRef(
            reference_id=reference["reference_id"],
            run_id=reference["run_id"],
            provider=reference["provider"],
            session_id=reference["session_id"],
            response_id=reference["response_id"],
            expires_at=mapping.timestamp(reference["expires_at"]),
            observed_at=mapping.timestamp(reference["observed_at"]),
        )

    async def RecordExecutionHandle(self, request, context):
        handle = await self.app.call(
            context,
            roles.of("Checkpoints", "RecordExecutionHandle"),
            lambda unit, principal: checkpoints.record_execution_handle(
                unit, principal, request.run_id, request.runtime, request.handle
            ),
        )
        return checkpoints_pb2.DurableExecutionHandle(
            handle_id=handle["handle_id"],
            run_id=handle["run_id"],
            runtime=handle["runtime"],
            handle=handle["handle"],
            created_at=mapping.timestamp(handle["created_at"]),
        )

    async def StoreLiveContinuation(self, request, context):
        raise checkpoints.live_continuation_refused()
