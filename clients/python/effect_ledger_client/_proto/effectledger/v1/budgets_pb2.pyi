import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BudgetScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUDGET_SCOPE_UNSPECIFIED: _ClassVar[BudgetScope]
    TENANT: _ClassVar[BudgetScope]
    RUN: _ClassVar[BudgetScope]
    RUN_TREE: _ClassVar[BudgetScope]

class ReservationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESERVATION_STATE_UNSPECIFIED: _ClassVar[ReservationState]
    RESERVATION_PENDING: _ClassVar[ReservationState]
    RESERVATION_POSTED: _ClassVar[ReservationState]
    RESERVATION_VOIDED: _ClassVar[ReservationState]
    RESERVATION_EXPIRED: _ClassVar[ReservationState]
BUDGET_SCOPE_UNSPECIFIED: BudgetScope
TENANT: BudgetScope
RUN: BudgetScope
RUN_TREE: BudgetScope
RESERVATION_STATE_UNSPECIFIED: ReservationState
RESERVATION_PENDING: ReservationState
RESERVATION_POSTED: ReservationState
RESERVATION_VOIDED: ReservationState
RESERVATION_EXPIRED: ReservationState

class Budget(_message.Message):
    __slots__ = ("budget_id", "scope", "scope_id", "dimension", "limit", "posted", "pending", "available", "reset_period_seconds", "period_started_at", "created_at", "updated_at", "exhausted")
    BUDGET_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    POSTED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RESET_PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    budget_id: str
    scope: BudgetScope
    scope_id: str
    dimension: str
    limit: int
    posted: int
    pending: int
    available: int
    reset_period_seconds: int
    period_started_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    exhausted: bool
    def __init__(self, budget_id: _Optional[str] = ..., scope: _Optional[_Union[BudgetScope, str]] = ..., scope_id: _Optional[str] = ..., dimension: _Optional[str] = ..., limit: _Optional[int] = ..., posted: _Optional[int] = ..., pending: _Optional[int] = ..., available: _Optional[int] = ..., reset_period_seconds: _Optional[int] = ..., period_started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("reservation_id", "budget_id", "attempt_id", "effect_id", "dimension", "amount", "state", "posted_amount", "created_at", "settled_at")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECT_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POSTED_AMOUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SETTLED_AT_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    budget_id: str
    attempt_id: str
    effect_id: str
    dimension: str
    amount: int
    state: ReservationState
    posted_amount: int
    created_at: _timestamp_pb2.Timestamp
    settled_at: _timestamp_pb2.Timestamp
    def __init__(self, reservation_id: _Optional[str] = ..., budget_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., effect_id: _Optional[str] = ..., dimension: _Optional[str] = ..., amount: _Optional[int] = ..., state: _Optional[_Union[ReservationState, str]] = ..., posted_amount: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., settled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PutBudgetRequest(_message.Message):
    __slots__ = ("scope", "scope_id", "dimension", "limit", "reset_period_seconds")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RESET_PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    scope: BudgetScope
    scope_id: str
    dimension: str
    limit: int
    reset_period_seconds: int
    def __init__(self, scope: _Optional[_Union[BudgetScope, str]] = ..., scope_id: _Optional[str] = ..., dimension: _Optional[str] = ..., limit: _Optional[int] = ..., reset_period_seconds: _Optional[int] = ...) -> None: ...

class GetBudgetRequest(_message.Message):
    __slots__ = ("scope", "scope_id")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    scope: BudgetScope
    scope_id: str
    def __init__(self, scope: _Optional[_Union[BudgetScope, str]] = ..., scope_id: _Optional[str] = ...) -> None: ...

class GetBudgetResponse(_message.Message):
    __slots__ = ("budgets", "open_reservations")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    OPEN_RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[Budget]
    open_reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    def __init__(self, budgets: _Optional[_Iterable[_Union[Budget, _Mapping]]] = ..., open_reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ...) -> None: ...

class RecordUsageRequest(_message.Message):
    __slots__ = ("run_id", "provider", "model", "segment", "usage", "request_id")
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    provider: str
    model: str
    segment: str
    usage: _containers.ScalarMap[str, int]
    request_id: str
    def __init__(self, run_id: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., segment: _Optional[str] = ..., usage: _Optional[_Mapping[str, int]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordUsageResponse(_message.Message):
    __slots__ = ("budgets", "usage_id")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    USAGE_ID_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[Budget]
    usage_id: str
    def __init__(self, budgets: _Optional[_Iterable[_Union[Budget, _Mapping]]] = ..., usage_id: _Optional[str] = ...) -> None: ...

class ListBudgetsRequest(_message.Message):
    __slots__ = ("scope", "scope_id", "dimension", "exhausted_only", "page_size", "page_token")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    scope: BudgetScope
    scope_id: str
    dimension: str
    exhausted_only: bool
    page_size: int
    page_token: str
    def __init__(self, scope: _Optional[_Union[BudgetScope, str]] = ..., scope_id: _Optional[str] = ..., dimension: _Optional[str] = ..., exhausted_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBudgetsResponse(_message.Message):
    __slots__ = ("budgets", "next_page_token")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[Budget]
    next_page_token: str
    def __init__(self, budgets: _Optional[_Iterable[_Union[Budget, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
