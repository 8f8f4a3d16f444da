import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckpointStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_STATUS_UNSPECIFIED: _ClassVar[CheckpointStatus]
    SEALED: _ClassVar[CheckpointStatus]
    REGISTERED: _ClassVar[CheckpointStatus]

class ArtifactClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARTIFACT_CLASS_UNSPECIFIED: _ClassVar[ArtifactClass]
    REQUIRED: _ClassVar[ArtifactClass]
    OPTIONAL: _ClassVar[ArtifactClass]

class ArtifactStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARTIFACT_STATUS_UNSPECIFIED: _ClassVar[ArtifactStatus]
    ARTIFACT_PENDING: _ClassVar[ArtifactStatus]
    ARTIFACT_COMPLETE: _ClassVar[ArtifactStatus]
    ARTIFACT_TOMBSTONE: _ClassVar[ArtifactStatus]

class World(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORLD_UNSPECIFIED: _ClassVar[World]
    LIVE: _ClassVar[World]
    SIMULATED: _ClassVar[World]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    COMPATIBLE: _ClassVar[Verdict]
    DEGRADED: _ClassVar[Verdict]
    INCOMPATIBLE: _ClassVar[Verdict]
CHECKPOINT_STATUS_UNSPECIFIED: CheckpointStatus
SEALED: CheckpointStatus
REGISTERED: CheckpointStatus
ARTIFACT_CLASS_UNSPECIFIED: ArtifactClass
REQUIRED: ArtifactClass
OPTIONAL: ArtifactClass
ARTIFACT_STATUS_UNSPECIFIED: ArtifactStatus
ARTIFACT_PENDING: ArtifactStatus
ARTIFACT_COMPLETE: ArtifactStatus
ARTIFACT_TOMBSTONE: ArtifactStatus
WORLD_UNSPECIFIED: World
LIVE: World
SIMULATED: World
VERDICT_UNSPECIFIED: Verdict
COMPATIBLE: Verdict
DEGRADED: Verdict
INCOMPATIBLE: Verdict

class Artifact(_message.Message):
    __slots__ = ("digest", "size_bytes", "media_type", "status", "location", "created_at", "updated_at")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    media_type: str
    status: ArtifactStatus
    location: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., status: _Optional[_Union[ArtifactStatus, str]] = ..., location: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("name", "digest", "classification")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    digest: str
    classification: ArtifactClass
    def __init__(self, name: _Optional[str] = ..., digest: _Optional[str] = ..., classification: _Optional[_Union[ArtifactClass, str]] = ...) -> None: ...

class CompatibilityFacts(_message.Message):
    __slots__ = ("runtime", "contract_schema", "code_version", "checkpoint_format", "native_references", "recorded_effects")
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    NATIVE_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    RECORDED_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    runtime: str
    contract_schema: str
    code_version: str
    checkpoint_format: int
    native_references: _containers.RepeatedScalarFieldContainer[str]
    recorded_effects: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, runtime: _Optional[str] = ..., contract_schema: _Optional[str] = ..., code_version: _Optional[str] = ..., checkpoint_format: _Optional[int] = ..., native_references: _Optional[_Iterable[str]] = ..., recorded_effects: _Optional[_Iterable[str]] = ...) -> None: ...

class Configuration(_message.Message):
    __slots__ = ("provider", "model", "adapter")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    provider: str
    model: str
    adapter: str
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("checkpoint_id", "run_id", "revision", "status", "format_version", "state_json", "artifacts", "manifest_json", "manifest_digest", "ledger_json", "facts", "sealed_by", "sealed_at", "registered_by", "registered_at", "derived_from", "imported_from_digest", "policy_revision")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LEDGER_JSON_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    SEALED_BY_FIELD_NUMBER: _ClassVar[int]
    SEALED_AT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_BY_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FROM_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FROM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    run_id: str
    revision: int
    status: CheckpointStatus
    format_version: int
    state_json: bytes
    artifacts: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    manifest_json: bytes
    manifest_digest: str
    ledger_json: bytes
    facts: CompatibilityFacts
    sealed_by: str
    sealed_at: _timestamp_pb2.Timestamp
    registered_by: str
    registered_at: _timestamp_pb2.Timestamp
    derived_from: str
    imported_from_digest: str
    policy_revision: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., run_id: _Optional[str] = ..., revision: _Optional[int] = ..., status: _Optional[_Union[CheckpointStatus, str]] = ..., format_version: _Optional[int] = ..., state_json: _Optional[bytes] = ..., artifacts: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., manifest_json: _Optional[bytes] = ..., manifest_digest: _Optional[str] = ..., ledger_json: _Optional[bytes] = ..., facts: _Optional[_Union[CompatibilityFacts, _Mapping]] = ..., sealed_by: _Optional[str] = ..., sealed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., registered_by: _Optional[str] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., derived_from: _Optional[str] = ..., imported_from_digest: _Optional[str] = ..., policy_revision: _Optional[str] = ...) -> None: ...

class SealCheckpointRequest(_message.Message):
    __slots__ = ("run_id", "expected_revision", "state_json", "artifacts", "facts")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    expected_revision: int
    state_json: bytes
    artifacts: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    facts: CompatibilityFacts
    def __init__(self, run_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., state_json: _Optional[bytes] = ..., artifacts: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., facts: _Optional[_Union[CompatibilityFacts, _Mapping]] = ...) -> None: ...

class RegisterCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id", "facts")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    facts: CompatibilityFacts
    def __init__(self, checkpoint_id: _Optional[str] = ..., facts: _Optional[_Union[CompatibilityFacts, _Mapping]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "next_page_token")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    next_page_token: str
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CheckResumeCompatibilityRequest(_message.Message):
    __slots__ = ("checkpoint_id", "current")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    current: CompatibilityFacts
    def __init__(self, checkpoint_id: _Optional[str] = ..., current: _Optional[_Union[CompatibilityFacts, _Mapping]] = ...) -> None: ...

class IncompatibleFact(_message.Message):
    __slots__ = ("fact", "reason", "degraded_only")
    FACT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_ONLY_FIELD_NUMBER: _ClassVar[int]
    fact: str
    reason: str
    degraded_only: bool
    def __init__(self, fact: _Optional[str] = ..., reason: _Optional[str] = ..., degraded_only: _Optional[bool] = ...) -> None: ...

class CompatibilityVerdict(_message.Message):
    __slots__ = ("verdict", "facts")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    facts: _containers.RepeatedCompositeFieldContainer[IncompatibleFact]
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., facts: _Optional[_Iterable[_Union[IncompatibleFact, _Mapping]]] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("checkpoint_id", "configuration", "reason", "current", "context_manifest_digest")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    configuration: Configuration
    reason: str
    current: CompatibilityFacts
    context_manifest_digest: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., configuration: _Optional[_Union[Configuration, _Mapping]] = ..., reason: _Optional[str] = ..., current: _Optional[_Union[CompatibilityFacts, _Mapping]] = ..., context_manifest_digest: _Optional[str] = ...) -> None: ...

class OpenEffect(_message.Message):
    __slots__ = ("effect_id", "tool", "target", "idempotency_key", "stage", "tool_revision")
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_REVISION_FIELD_NUMBER: _ClassVar[int]
    effect_id: str
    tool: str
    target: str
    idempotency_key: str
    stage: str
    tool_revision: int
    def __init__(self, effect_id: _Optional[str] = ..., tool: _Optional[str] = ..., target: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., stage: _Optional[str] = ..., tool_revision: _Optional[int] = ...) -> None: ...

class ResumeRunResponse(_message.Message):
    __slots__ = ("run_id", "revision", "segment", "open_effects", "verdict")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OPEN_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    revision: int
    segment: int
    open_effects: _containers.RepeatedCompositeFieldContainer[OpenEffect]
    verdict: CompatibilityVerdict
    def __init__(self, run_id: _Optional[str] = ..., revision: _Optional[int] = ..., segment: _Optional[int] = ..., open_effects: _Optional[_Iterable[_Union[OpenEffect, _Mapping]]] = ..., verdict: _Optional[_Union[CompatibilityVerdict, _Mapping]] = ...) -> None: ...

class ForkRunRequest(_message.Message):
    __slots__ = ("checkpoint_id", "world", "difference")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    world: World
    difference: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., world: _Optional[_Union[World, str]] = ..., difference: _Optional[str] = ...) -> None: ...

class ForkRunResponse(_message.Message):
    __slots__ = ("run_id", "parent_run_id", "world")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    parent_run_id: str
    world: World
    def __init__(self, run_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., world: _Optional[_Union[World, str]] = ...) -> None: ...

class ExportCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class ArchiveChunk(_message.Message):
    __slots__ = ("data", "expected_manifest_digest", "allow_unsigned")
    DATA_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UNSIGNED_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    expected_manifest_digest: str
    allow_unsigned: bool
    def __init__(self, data: _Optional[bytes] = ..., expected_manifest_digest: _Optional[str] = ..., allow_unsigned: _Optional[bool] = ...) -> None: ...

class PutArtifactRequest(_message.Message):
    __slots__ = ("content", "media_type")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    media_type: str
    def __init__(self, content: _Optional[bytes] = ..., media_type: _Optional[str] = ...) -> None: ...

class DeclareArtifactRequest(_message.Message):
    __slots__ = ("digest", "size_bytes", "media_type", "location")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    media_type: str
    location: str
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., location: _Optional[str] = ...) -> None: ...

class CompleteArtifactRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class DeleteArtifactRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("snapshot_id", "run_id", "value_json", "created_at")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    run_id: str
    value_json: bytes
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, snapshot_id: _Optional[str] = ..., run_id: _Optional[str] = ..., value_json: _Optional[bytes] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecordSnapshotRequest(_message.Message):
    __slots__ = ("run_id", "value_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    value_json: bytes
    def __init__(self, run_id: _Optional[str] = ..., value_json: _Optional[bytes] = ...) -> None: ...

class ProviderSessionRef(_message.Message):
    __slots__ = ("reference_id", "run_id", "provider", "session_id", "response_id", "expires_at", "observed_at")
    REFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    reference_id: str
    run_id: str
    provider: str
    session_id: str
    response_id: str
    expires_at: _timestamp_pb2.Timestamp
    observed_at: _timestamp_pb2.Timestamp
    def __init__(self, reference_id: _Optional[str] = ..., run_id: _Optional[str] = ..., provider: _Optional[str] = ..., session_id: _Optional[str] = ..., response_id: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecordProviderSessionRequest(_message.Message):
    __slots__ = ("run_id", "provider", "session_id", "response_id", "expires_at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    provider: str
    session_id: str
    response_id: str
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., provider: _Optional[str] = ..., session_id: _Optional[str] = ..., response_id: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DurableExecutionHandle(_message.Message):
    __slots__ = ("handle_id", "run_id", "runtime", "handle", "created_at")
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    handle_id: str
    run_id: str
    runtime: str
    handle: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, handle_id: _Optional[str] = ..., run_id: _Optional[str] = ..., runtime: _Optional[str] = ..., handle: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecordExecutionHandleRequest(_message.Message):
    __slots__ = ("run_id", "runtime", "handle")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    runtime: str
    handle: str
    def __init__(self, run_id: _Optional[str] = ..., runtime: _Optional[str] = ..., handle: _Optional[str] = ...) -> None: ...

class LiveContinuation(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...
