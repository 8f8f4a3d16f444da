import datetime

from effectledger.v1 import retention_pb2 as _retention_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Run(_message.Message):
    __slots__ = ("run_id", "created_by", "created_at", "revision", "head_hash", "labels", "parent_run_id", "root_run_id", "world", "forked_from_checkpoint", "segment", "provider", "model", "adapter")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    revision: int
    head_hash: str
    labels: _containers.ScalarMap[str, str]
    parent_run_id: str
    root_run_id: str
    world: str
    forked_from_checkpoint: str
    segment: int
    provider: str
    model: str
    adapter: str
    def __init__(self, run_id: _Optional[str] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., head_hash: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., parent_run_id: _Optional[str] = ..., root_run_id: _Optional[str] = ..., world: _Optional[str] = ..., forked_from_checkpoint: _Optional[str] = ..., segment: _Optional[int] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("request_id", "labels", "provider", "model", "adapter")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    labels: _containers.ScalarMap[str, str]
    provider: str
    model: str
    adapter: str
    def __init__(self, request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., adapter: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunEventsRequest(_message.Message):
    __slots__ = ("run_id", "after_revision", "page_size")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_revision: int
    page_size: int
    def __init__(self, run_id: _Optional[str] = ..., after_revision: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("run_id", "revision", "type", "payload_json", "principal_id", "created_at", "prev_hash", "hash", "removed_by_retention")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BY_RETENTION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    revision: int
    type: str
    payload_json: bytes
    principal_id: str
    created_at: _timestamp_pb2.Timestamp
    prev_hash: str
    hash: str
    removed_by_retention: _retention_pb2.RetentionTombstone
    def __init__(self, run_id: _Optional[str] = ..., revision: _Optional[int] = ..., type: _Optional[str] = ..., payload_json: _Optional[bytes] = ..., principal_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ..., removed_by_retention: _Optional[_Union[_retention_pb2.RetentionTombstone, _Mapping]] = ...) -> None: ...

class ListRunEventsResponse(_message.Message):
    __slots__ = ("events", "next_after_revision")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    next_after_revision: int
    def __init__(self, events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ..., next_after_revision: _Optional[int] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("label_key", "label_value", "created_after", "created_before", "page_size", "page_token")
    LABEL_KEY_FIELD_NUMBER: _ClassVar[int]
    LABEL_VALUE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_key: str
    label_value: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, label_key: _Optional[str] = ..., label_value: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
