import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetentionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETENTION_KIND_UNSPECIFIED: _ClassVar[RetentionKind]
    TRACE: _ClassVar[RetentionKind]
    DECISIONS: _ClassVar[RetentionKind]
    ARTIFACTS: _ClassVar[RetentionKind]
    SNAPSHOTS: _ClassVar[RetentionKind]
RETENTION_KIND_UNSPECIFIED: RetentionKind
TRACE: RetentionKind
DECISIONS: RetentionKind
ARTIFACTS: RetentionKind
SNAPSHOTS: RetentionKind

class RetentionRule(_message.Message):
    __slots__ = ("kind", "max_age_seconds", "updated_by", "updated_at")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    kind: RetentionKind
    max_age_seconds: int
    updated_by: str
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[RetentionKind, str]] = ..., max_age_seconds: _Optional[int] = ..., updated_by: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PutRetentionRuleRequest(_message.Message):
    __slots__ = ("kind", "max_age_seconds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    kind: RetentionKind
    max_age_seconds: int
    def __init__(self, kind: _Optional[_Union[RetentionKind, str]] = ..., max_age_seconds: _Optional[int] = ...) -> None: ...

class ListRetentionRulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRetentionRulesResponse(_message.Message):
    __slots__ = ("rules",)
    RULES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[RetentionRule]
    def __init__(self, rules: _Optional[_Iterable[_Union[RetentionRule, _Mapping]]] = ...) -> None: ...

class LegalHold(_message.Message):
    __slots__ = ("run_id", "reason", "placed_by", "placed_at", "released_by", "released_at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLACED_BY_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    placed_by: str
    placed_at: _timestamp_pb2.Timestamp
    released_by: str
    released_at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., placed_by: _Optional[str] = ..., placed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., released_by: _Optional[str] = ..., released_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PlaceLegalHoldRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseLegalHoldRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListLegalHoldsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "include_released")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    include_released: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_released: _Optional[bool] = ...) -> None: ...

class ListLegalHoldsResponse(_message.Message):
    __slots__ = ("holds", "next_page_token")
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    holds: _containers.RepeatedCompositeFieldContainer[LegalHold]
    next_page_token: str
    def __init__(self, holds: _Optional[_Iterable[_Union[LegalHold, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CollectRetentionRequest(_message.Message):
    __slots__ = ("dry_run",)
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    def __init__(self, dry_run: _Optional[bool] = ...) -> None: ...

class CollectRetentionResponse(_message.Message):
    __slots__ = ("trace_events", "decisions", "artifacts", "snapshots", "tombstones_written", "more")
    TRACE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    trace_events: int
    decisions: int
    artifacts: int
    snapshots: int
    tombstones_written: int
    more: bool
    def __init__(self, trace_events: _Optional[int] = ..., decisions: _Optional[int] = ..., artifacts: _Optional[int] = ..., snapshots: _Optional[int] = ..., tombstones_written: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class RetentionTombstone(_message.Message):
    __slots__ = ("tombstone_id", "kind", "subject", "material_digest", "rule_max_age_seconds", "removed_at", "removed_by")
    TOMBSTONE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RULE_MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AT_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BY_FIELD_NUMBER: _ClassVar[int]
    tombstone_id: str
    kind: RetentionKind
    subject: str
    material_digest: str
    rule_max_age_seconds: int
    removed_at: _timestamp_pb2.Timestamp
    removed_by: str
    def __init__(self, tombstone_id: _Optional[str] = ..., kind: _Optional[_Union[RetentionKind, str]] = ..., subject: _Optional[str] = ..., material_digest: _Optional[str] = ..., rule_max_age_seconds: _Optional[int] = ..., removed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., removed_by: _Optional[str] = ...) -> None: ...
