import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from effect_ledger_client._proto.effectledger.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolContract(_message.Message):
    __slots__ = ("tool", "revision", "effect_class", "provider_idempotency", "queryable", "allowed_recovery", "arguments_schema_json", "max_attempts", "lease_seconds", "retired", "created_at", "created_by", "retired_reason", "default_estimate", "simulator")
    class DefaultEstimateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOOL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EFFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_IDEMPOTENCY_FIELD_NUMBER: _ClassVar[int]
    QUERYABLE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_RECOVERY_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    RETIRED_REASON_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    SIMULATOR_FIELD_NUMBER: _ClassVar[int]
    tool: str
    revision: int
    effect_class: _common_pb2.EffectClass
    provider_idempotency: bool
    queryable: bool
    allowed_recovery: _containers.RepeatedScalarFieldContainer[_common_pb2.Recovery]
    arguments_schema_json: bytes
    max_attempts: int
    lease_seconds: int
    retired: bool
    created_at: _timestamp_pb2.Timestamp
    created_by: str
    retired_reason: str
    default_estimate: _containers.ScalarMap[str, int]
    simulator: bool
    def __init__(self, tool: _Optional[str] = ..., revision: _Optional[int] = ..., effect_class: _Optional[_Union[_common_pb2.EffectClass, str]] = ..., provider_idempotency: _Optional[bool] = ..., queryable: _Optional[bool] = ..., allowed_recovery: _Optional[_Iterable[_Union[_common_pb2.Recovery, str]]] = ..., arguments_schema_json: _Optional[bytes] = ..., max_attempts: _Optional[int] = ..., lease_seconds: _Optional[int] = ..., retired: _Optional[bool] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_by: _Optional[str] = ..., retired_reason: _Optional[str] = ..., default_estimate: _Optional[_Mapping[str, int]] = ..., simulator: _Optional[bool] = ...) -> None: ...

class PutToolContractRequest(_message.Message):
    __slots__ = ("contract", "expected_revision")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    contract: ToolContract
    expected_revision: int
    def __init__(self, contract: _Optional[_Union[ToolContract, _Mapping]] = ..., expected_revision: _Optional[int] = ...) -> None: ...

class GetToolContractRequest(_message.Message):
    __slots__ = ("tool", "revision")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    tool: str
    revision: int
    def __init__(self, tool: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class ListToolContractsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "include_retired")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RETIRED_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    include_retired: bool
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_retired: _Optional[bool] = ...) -> None: ...

class ListToolContractsResponse(_message.Message):
    __slots__ = ("contracts", "next_page_token")
    CONTRACTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    contracts: _containers.RepeatedCompositeFieldContainer[ToolContract]
    next_page_token: str
    def __init__(self, contracts: _Optional[_Iterable[_Union[ToolContract, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RetireToolRequest(_message.Message):
    __slots__ = ("tool", "reason")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tool: str
    reason: str
    def __init__(self, tool: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
