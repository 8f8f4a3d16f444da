import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from effectledger.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FailureEvidence(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_EVIDENCE_UNSPECIFIED: _ClassVar[FailureEvidence]
    NOT_SENT: _ClassVar[FailureEvidence]
    PROVIDER_REJECTED: _ClassVar[FailureEvidence]
FAILURE_EVIDENCE_UNSPECIFIED: FailureEvidence
NOT_SENT: FailureEvidence
PROVIDER_REJECTED: FailureEvidence

class AuthorizeEffectRequest(_message.Message):
    __slots__ = ("run_id", "tool", "arguments_json", "idempotency_key", "target", "estimate", "begin_dispatched")
    class EstimateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool: str
    arguments_json: bytes
    idempotency_key: str
    target: str
    estimate: _containers.ScalarMap[str, int]
    begin_dispatched: bool
    def __init__(self, run_id: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., target: _Optional[str] = ..., estimate: _Optional[_Mapping[str, int]] = ..., begin_dispatched: _Optional[bool] = ...) -> None: ...

class AuthorizeEffectResponse(_message.Message):
    __slots__ = ("outcome", "effect_id", "attempt_id", "provider_idempotency_key", "lease_expires_at", "intent_digest", "reasons", "decision_id", "policy_revision", "receipt", "provider_key_reused", "tool_revision", "effect_stage", "attempt_number", "approval_request_id", "approval_id", "reservation_ids", "schedule_id")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    INTENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_REUSED_FIELD_NUMBER: _ClassVar[int]
    TOOL_REVISION_FIELD_NUMBER: _ClassVar[int]
    EFFECT_STAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_IDS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    outcome: _common_pb2.Outcome
    effect_id: str
    attempt_id: str
    provider_idempotency_key: str
    lease_expires_at: _timestamp_pb2.Timestamp
    intent_digest: str
    reasons: _containers.RepeatedCompositeFieldContainer[_common_pb2.Reason]
    decision_id: str
    policy_revision: str
    receipt: _common_pb2.Receipt
    provider_key_reused: bool
    tool_revision: int
    effect_stage: _common_pb2.Stage
    attempt_number: int
    approval_request_id: str
    approval_id: str
    reservation_ids: _containers.RepeatedScalarFieldContainer[str]
    schedule_id: str
    def __init__(self, outcome: _Optional[_Union[_common_pb2.Outcome, str]] = ..., effect_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., provider_idempotency_key: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., intent_digest: _Optional[str] = ..., reasons: _Optional[_Iterable[_Union[_common_pb2.Reason, _Mapping]]] = ..., decision_id: _Optional[str] = ..., policy_revision: _Optional[str] = ..., receipt: _Optional[_Union[_common_pb2.Receipt, _Mapping]] = ..., provider_key_reused: _Optional[bool] = ..., tool_revision: _Optional[int] = ..., effect_stage: _Optional[_Union[_common_pb2.Stage, str]] = ..., attempt_number: _Optional[int] = ..., approval_request_id: _Optional[str] = ..., approval_id: _Optional[str] = ..., reservation_ids: _Optional[_Iterable[str]] = ..., schedule_id: _Optional[str] = ...) -> None: ...

class RecordDispatchRequest(_message.Message):
    __slots__ = ("attempt_id",)
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    def __init__(self, attempt_id: _Optional[str] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("attempt_id",)
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    def __init__(self, attempt_id: _Optional[str] = ...) -> None: ...

class RecordOutcomeRequest(_message.Message):
    __slots__ = ("attempt_id", "succeeded", "failed", "unknown")
    class Succeeded(_message.Message):
        __slots__ = ("receipt", "usage")
        class UsageEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: int
            def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
        RECEIPT_FIELD_NUMBER: _ClassVar[int]
        USAGE_FIELD_NUMBER: _ClassVar[int]
        receipt: _common_pb2.Receipt
        usage: _containers.ScalarMap[str, int]
        def __init__(self, receipt: _Optional[_Union[_common_pb2.Receipt, _Mapping]] = ..., usage: _Optional[_Mapping[str, int]] = ...) -> None: ...
    class Failed(_message.Message):
        __slots__ = ("reason", "evidence")
        REASON_FIELD_NUMBER: _ClassVar[int]
        EVIDENCE_FIELD_NUMBER: _ClassVar[int]
        reason: str
        evidence: FailureEvidence
        def __init__(self, reason: _Optional[str] = ..., evidence: _Optional[_Union[FailureEvidence, str]] = ...) -> None: ...
    class Unknown(_message.Message):
        __slots__ = ("reason",)
        REASON_FIELD_NUMBER: _ClassVar[int]
        reason: str
        def __init__(self, reason: _Optional[str] = ...) -> None: ...
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    succeeded: RecordOutcomeRequest.Succeeded
    failed: RecordOutcomeRequest.Failed
    unknown: RecordOutcomeRequest.Unknown
    def __init__(self, attempt_id: _Optional[str] = ..., succeeded: _Optional[_Union[RecordOutcomeRequest.Succeeded, _Mapping]] = ..., failed: _Optional[_Union[RecordOutcomeRequest.Failed, _Mapping]] = ..., unknown: _Optional[_Union[RecordOutcomeRequest.Unknown, _Mapping]] = ...) -> None: ...

class ReleaseAttemptRequest(_message.Message):
    __slots__ = ("attempt_id", "reason")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: str
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AttemptResponse(_message.Message):
    __slots__ = ("attempt", "effect_stage", "changed")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    EFFECT_STAGE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    effect_stage: _common_pb2.Stage
    changed: bool
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ..., effect_stage: _Optional[_Union[_common_pb2.Stage, str]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ReconcileEffectRequest(_message.Message):
    __slots__ = ("effect_id", "receipt", "not_happened")
    class NotHappened(_message.Message):
        __slots__ = ("reason", "lookup_reference", "lookup_result_json")
        REASON_FIELD_NUMBER: _ClassVar[int]
        LOOKUP_REFERENCE_FIELD_NUMBER: _ClassVar[int]
        LOOKUP_RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
        reason: str
        lookup_reference: str
        lookup_result_json: bytes
        def __init__(self, reason: _Optional[str] = ..., lookup_reference: _Optional[str] = ..., lookup_result_json: _Optional[bytes] = ...) -> None: ...
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    NOT_HAPPENED_FIELD_NUMBER: _ClassVar[int]
    effect_id: str
    receipt: _common_pb2.Receipt
    not_happened: ReconcileEffectRequest.NotHappened
    def __init__(self, effect_id: _Optional[str] = ..., receipt: _Optional[_Union[_common_pb2.Receipt, _Mapping]] = ..., not_happened: _Optional[_Union[ReconcileEffectRequest.NotHappened, _Mapping]] = ...) -> None: ...

class GetEffectRequest(_message.Message):
    __slots__ = ("effect_id",)
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    effect_id: str
    def __init__(self, effect_id: _Optional[str] = ...) -> None: ...

class ListOpenEffectsRequest(_message.Message):
    __slots__ = ("run_id", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListOpenEffectsResponse(_message.Message):
    __slots__ = ("effects", "next_page_token")
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    effects: _containers.RepeatedCompositeFieldContainer[Effect]
    next_page_token: str
    def __init__(self, effects: _Optional[_Iterable[_Union[Effect, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetDecisionRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "effect_id", "number", "stage", "provider_idempotency_key", "lease_expires_at", "authorized_at", "dispatched_at", "finished_at", "decision_id", "outcome_reason", "failure_evidence", "receipt", "provider_key_reused", "approval_id")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZED_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REASON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_REUSED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    effect_id: str
    number: int
    stage: _common_pb2.Stage
    provider_idempotency_key: str
    lease_expires_at: _timestamp_pb2.Timestamp
    authorized_at: _timestamp_pb2.Timestamp
    dispatched_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    decision_id: str
    outcome_reason: str
    failure_evidence: FailureEvidence
    receipt: _common_pb2.Receipt
    provider_key_reused: bool
    approval_id: str
    def __init__(self, attempt_id: _Optional[str] = ..., effect_id: _Optional[str] = ..., number: _Optional[int] = ..., stage: _Optional[_Union[_common_pb2.Stage, str]] = ..., provider_idempotency_key: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., authorized_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decision_id: _Optional[str] = ..., outcome_reason: _Optional[str] = ..., failure_evidence: _Optional[_Union[FailureEvidence, str]] = ..., receipt: _Optional[_Union[_common_pb2.Receipt, _Mapping]] = ..., provider_key_reused: _Optional[bool] = ..., approval_id: _Optional[str] = ...) -> None: ...

class Effect(_message.Message):
    __slots__ = ("effect_id", "run_id", "tool", "tool_revision", "target", "idempotency_key", "intent_digest", "arguments_json", "stage", "attempts", "receipt", "created_at", "updated_at", "reconciled_by", "reconcile_reason")
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_REVISION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    INTENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    RECONCILED_BY_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_REASON_FIELD_NUMBER: _ClassVar[int]
    effect_id: str
    run_id: str
    tool: str
    tool_revision: int
    target: str
    idempotency_key: str
    intent_digest: str
    arguments_json: bytes
    stage: _common_pb2.Stage
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    receipt: _common_pb2.Receipt
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    reconciled_by: str
    reconcile_reason: str
    def __init__(self, effect_id: _Optional[str] = ..., run_id: _Optional[str] = ..., tool: _Optional[str] = ..., tool_revision: _Optional[int] = ..., target: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., intent_digest: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., stage: _Optional[_Union[_common_pb2.Stage, str]] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., receipt: _Optional[_Union[_common_pb2.Receipt, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reconciled_by: _Optional[str] = ..., reconcile_reason: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("decision_id", "run_id", "effect_id", "attempt_id", "outcome", "reasons", "policy_revision", "engine", "input_digest", "input_json", "intent_digest", "idempotency_key", "principal_id", "created_at", "tool")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    INTENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    run_id: str
    effect_id: str
    attempt_id: str
    outcome: _common_pb2.Outcome
    reasons: _containers.RepeatedCompositeFieldContainer[_common_pb2.Reason]
    policy_revision: str
    engine: str
    input_digest: str
    input_json: bytes
    intent_digest: str
    idempotency_key: str
    principal_id: str
    created_at: _timestamp_pb2.Timestamp
    tool: str
    def __init__(self, decision_id: _Optional[str] = ..., run_id: _Optional[str] = ..., effect_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., outcome: _Optional[_Union[_common_pb2.Outcome, str]] = ..., reasons: _Optional[_Iterable[_Union[_common_pb2.Reason, _Mapping]]] = ..., policy_revision: _Optional[str] = ..., engine: _Optional[str] = ..., input_digest: _Optional[str] = ..., input_json: _Optional[bytes] = ..., intent_digest: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., principal_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool: _Optional[str] = ...) -> None: ...

class ListEffectsRequest(_message.Message):
    __slots__ = ("stages", "tool", "run_id", "target", "created_after", "created_before", "page_size", "page_token")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedScalarFieldContainer[_common_pb2.Stage]
    tool: str
    run_id: str
    target: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, stages: _Optional[_Iterable[_Union[_common_pb2.Stage, str]]] = ..., tool: _Optional[str] = ..., run_id: _Optional[str] = ..., target: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEffectsResponse(_message.Message):
    __slots__ = ("effects", "next_page_token")
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    effects: _containers.RepeatedCompositeFieldContainer[Effect]
    next_page_token: str
    def __init__(self, effects: _Optional[_Iterable[_Union[Effect, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("outcome", "reason", "run_id", "tool", "page_size", "page_token")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    outcome: _common_pb2.Outcome
    reason: str
    run_id: str
    tool: str
    page_size: int
    page_token: str
    def __init__(self, outcome: _Optional[_Union[_common_pb2.Outcome, str]] = ..., reason: _Optional[str] = ..., run_id: _Optional[str] = ..., tool: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions", "next_page_token")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    next_page_token: str
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayDecisionRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class ReplayDecisionResponse(_message.Message):
    __slots__ = ("recorded", "outcome", "reasons", "policy_revision", "engine", "package", "outcome_changed", "policy_changed", "reasons_added", "reasons_removed")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_CHANGED_FIELD_NUMBER: _ClassVar[int]
    POLICY_CHANGED_FIELD_NUMBER: _ClassVar[int]
    REASONS_ADDED_FIELD_NUMBER: _ClassVar[int]
    REASONS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    recorded: Decision
    outcome: _common_pb2.Outcome
    reasons: _containers.RepeatedCompositeFieldContainer[_common_pb2.Reason]
    policy_revision: str
    engine: str
    package: str
    outcome_changed: bool
    policy_changed: bool
    reasons_added: _containers.RepeatedScalarFieldContainer[str]
    reasons_removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, recorded: _Optional[_Union[Decision, _Mapping]] = ..., outcome: _Optional[_Union[_common_pb2.Outcome, str]] = ..., reasons: _Optional[_Iterable[_Union[_common_pb2.Reason, _Mapping]]] = ..., policy_revision: _Optional[str] = ..., engine: _Optional[str] = ..., package: _Optional[str] = ..., outcome_changed: _Optional[bool] = ..., policy_changed: _Optional[bool] = ..., reasons_added: _Optional[_Iterable[str]] = ..., reasons_removed: _Optional[_Iterable[str]] = ...) -> None: ...
