import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScheduleState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_STATE_UNSPECIFIED: _ClassVar[ScheduleState]
    SCHEDULED: _ClassVar[ScheduleState]
    DUE: _ClassVar[ScheduleState]
    SCHEDULE_CONSUMED: _ClassVar[ScheduleState]
    SCHEDULE_CANCELLED: _ClassVar[ScheduleState]
    SCHEDULE_EXPIRED: _ClassVar[ScheduleState]

class SchedulePurpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_PURPOSE_UNSPECIFIED: _ClassVar[SchedulePurpose]
    DELAYED_RETRY: _ClassVar[SchedulePurpose]
    RATE_LIMIT: _ClassVar[SchedulePurpose]
    APPROVAL_WAIT: _ClassVar[SchedulePurpose]
    RECOVERY_CHECK: _ClassVar[SchedulePurpose]

class CancelCondition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_CONDITION_UNSPECIFIED: _ClassVar[CancelCondition]
    CANCEL_WHEN_EFFECT_SUCCEEDED: _ClassVar[CancelCondition]
    CANCEL_WHEN_RUN_RESUMED: _ClassVar[CancelCondition]
SCHEDULE_STATE_UNSPECIFIED: ScheduleState
SCHEDULED: ScheduleState
DUE: ScheduleState
SCHEDULE_CONSUMED: ScheduleState
SCHEDULE_CANCELLED: ScheduleState
SCHEDULE_EXPIRED: ScheduleState
SCHEDULE_PURPOSE_UNSPECIFIED: SchedulePurpose
DELAYED_RETRY: SchedulePurpose
RATE_LIMIT: SchedulePurpose
APPROVAL_WAIT: SchedulePurpose
RECOVERY_CHECK: SchedulePurpose
CANCEL_CONDITION_UNSPECIFIED: CancelCondition
CANCEL_WHEN_EFFECT_SUCCEEDED: CancelCondition
CANCEL_WHEN_RUN_RESUMED: CancelCondition

class Schedule(_message.Message):
    __slots__ = ("schedule_id", "run_id", "idempotency_key", "tool", "tool_revision", "target", "arguments_json", "intent_digest", "effect_id", "purpose", "state", "not_before", "deadline", "cancel_conditions", "reservation", "clock", "note", "created_by", "created_at", "due_at", "due_sequence", "fired_by", "closed_at", "closed_by", "close_reason", "decision_id")
    class ReservationEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_REVISION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    INTENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    DUE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FIRED_BY_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_BY_FIELD_NUMBER: _ClassVar[int]
    CLOSE_REASON_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    run_id: str
    idempotency_key: str
    tool: str
    tool_revision: int
    target: str
    arguments_json: bytes
    intent_digest: str
    effect_id: str
    purpose: SchedulePurpose
    state: ScheduleState
    not_before: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    cancel_conditions: _containers.RepeatedScalarFieldContainer[CancelCondition]
    reservation: _containers.ScalarMap[str, int]
    clock: str
    note: str
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    due_at: _timestamp_pb2.Timestamp
    due_sequence: int
    fired_by: str
    closed_at: _timestamp_pb2.Timestamp
    closed_by: str
    close_reason: str
    decision_id: str
    def __init__(self, schedule_id: _Optional[str] = ..., run_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., tool: _Optional[str] = ..., tool_revision: _Optional[int] = ..., target: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., intent_digest: _Optional[str] = ..., effect_id: _Optional[str] = ..., purpose: _Optional[_Union[SchedulePurpose, str]] = ..., state: _Optional[_Union[ScheduleState, str]] = ..., not_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_conditions: _Optional[_Iterable[_Union[CancelCondition, str]]] = ..., reservation: _Optional[_Mapping[str, int]] = ..., clock: _Optional[str] = ..., note: _Optional[str] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., due_sequence: _Optional[int] = ..., fired_by: _Optional[str] = ..., closed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., closed_by: _Optional[str] = ..., close_reason: _Optional[str] = ..., decision_id: _Optional[str] = ...) -> None: ...

class ScheduleIntentRequest(_message.Message):
    __slots__ = ("run_id", "tool", "arguments_json", "idempotency_key", "target", "purpose", "not_before", "delay_seconds", "deadline", "cancel_conditions", "hold_budget", "note")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    HOLD_BUDGET_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool: str
    arguments_json: bytes
    idempotency_key: str
    target: str
    purpose: SchedulePurpose
    not_before: _timestamp_pb2.Timestamp
    delay_seconds: int
    deadline: _timestamp_pb2.Timestamp
    cancel_conditions: _containers.RepeatedScalarFieldContainer[CancelCondition]
    hold_budget: bool
    note: str
    def __init__(self, run_id: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ..., target: _Optional[str] = ..., purpose: _Optional[_Union[SchedulePurpose, str]] = ..., not_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay_seconds: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cancel_conditions: _Optional[_Iterable[_Union[CancelCondition, str]]] = ..., hold_budget: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("run_id", "state", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: ScheduleState
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[ScheduleState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "reason")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    reason: str
    def __init__(self, schedule_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchDueIntentsRequest(_message.Message):
    __slots__ = ("run_id", "after_sequence")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_sequence: int
    def __init__(self, run_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class DueIntent(_message.Message):
    __slots__ = ("sequence", "schedule")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    schedule: Schedule
    def __init__(self, sequence: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...
