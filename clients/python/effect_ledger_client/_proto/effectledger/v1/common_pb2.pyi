import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EffectClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EFFECT_CLASS_UNSPECIFIED: _ClassVar[EffectClass]
    READ_ONLY: _ClassVar[EffectClass]
    IDEMPOTENT: _ClassVar[EffectClass]
    RETRYABLE_WITH_KEY: _ClassVar[EffectClass]
    COMPENSATABLE: _ClassVar[EffectClass]
    IRREVERSIBLE: _ClassVar[EffectClass]

class Recovery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECOVERY_UNSPECIFIED: _ClassVar[Recovery]
    RETRY_SAME_KEY: _ClassVar[Recovery]
    QUERY_THEN_RETRY: _ClassVar[Recovery]
    COMPENSATE: _ClassVar[Recovery]
    MANUAL_ONLY: _ClassVar[Recovery]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    AUTHORIZED: _ClassVar[Stage]
    DISPATCHED: _ClassVar[Stage]
    UNKNOWN: _ClassVar[Stage]
    SUCCEEDED: _ClassVar[Stage]
    FAILED: _ClassVar[Stage]
    RELEASED: _ClassVar[Stage]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    ALLOW: _ClassVar[Outcome]
    DENY: _ClassVar[Outcome]
    REQUIRE_APPROVAL: _ClassVar[Outcome]
    DUPLICATE: _ClassVar[Outcome]
    RECONCILE_REQUIRED: _ClassVar[Outcome]
EFFECT_CLASS_UNSPECIFIED: EffectClass
READ_ONLY: EffectClass
IDEMPOTENT: EffectClass
RETRYABLE_WITH_KEY: EffectClass
COMPENSATABLE: EffectClass
IRREVERSIBLE: EffectClass
RECOVERY_UNSPECIFIED: Recovery
RETRY_SAME_KEY: Recovery
QUERY_THEN_RETRY: Recovery
COMPENSATE: Recovery
MANUAL_ONLY: Recovery
STAGE_UNSPECIFIED: Stage
AUTHORIZED: Stage
DISPATCHED: Stage
UNKNOWN: Stage
SUCCEEDED: Stage
FAILED: Stage
RELEASED: Stage
OUTCOME_UNSPECIFIED: Outcome
ALLOW: Outcome
DENY: Outcome
REQUIRE_APPROVAL: Outcome
DUPLICATE: Outcome
RECONCILE_REQUIRED: Outcome

class Receipt(_message.Message):
    __slots__ = ("provider_reference", "detail_json", "digest", "recorded_at")
    PROVIDER_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    provider_reference: str
    detail_json: bytes
    digest: str
    recorded_at: _timestamp_pb2.Timestamp
    def __init__(self, provider_reference: _Optional[str] = ..., detail_json: _Optional[bytes] = ..., digest: _Optional[str] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Reason(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
