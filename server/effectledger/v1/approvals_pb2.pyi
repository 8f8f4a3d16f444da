import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApprovalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATE_UNSPECIFIED: _ClassVar[ApprovalState]
    PENDING: _ClassVar[ApprovalState]
    APPROVED: _ClassVar[ApprovalState]
    DENIED: _ClassVar[ApprovalState]
    REVOKED: _ClassVar[ApprovalState]
    CONSUMED: _ClassVar[ApprovalState]
    EXPIRED: _ClassVar[ApprovalState]
APPROVAL_STATE_UNSPECIFIED: ApprovalState
PENDING: ApprovalState
APPROVED: ApprovalState
DENIED: ApprovalState
REVOKED: ApprovalState
CONSUMED: ApprovalState
EXPIRED: ApprovalState

class ApprovalVote(_message.Message):
    __slots__ = ("reviewer_id", "approve", "comment", "created_at")
    REVIEWER_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    reviewer_id: str
    approve: bool
    comment: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, reviewer_id: _Optional[str] = ..., approve: _Optional[bool] = ..., comment: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "run_id", "tool", "tool_revision", "target", "intent_digest", "arguments_json", "requested_by", "state", "reusable", "quorum", "reason", "created_at", "expires_at", "updated_at", "votes", "consumed_by_attempt", "revoked_by", "revoke_reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_REVISION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    INTENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_BY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKE_REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    run_id: str
    tool: str
    tool_revision: int
    target: str
    intent_digest: str
    arguments_json: bytes
    requested_by: str
    state: ApprovalState
    reusable: bool
    quorum: int
    reason: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    votes: _containers.RepeatedCompositeFieldContainer[ApprovalVote]
    consumed_by_attempt: str
    revoked_by: str
    revoke_reason: str
    def __init__(self, approval_id: _Optional[str] = ..., run_id: _Optional[str] = ..., tool: _Optional[str] = ..., tool_revision: _Optional[int] = ..., target: _Optional[str] = ..., intent_digest: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., requested_by: _Optional[str] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., reusable: _Optional[bool] = ..., quorum: _Optional[int] = ..., reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., votes: _Optional[_Iterable[_Union[ApprovalVote, _Mapping]]] = ..., consumed_by_attempt: _Optional[str] = ..., revoked_by: _Optional[str] = ..., revoke_reason: _Optional[str] = ...) -> None: ...

class RequestApprovalRequest(_message.Message):
    __slots__ = ("run_id", "tool", "arguments_json", "target", "reason", "reusable", "ttl_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool: str
    arguments_json: bytes
    target: str
    reason: str
    reusable: bool
    ttl_seconds: int
    def __init__(self, run_id: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[bytes] = ..., target: _Optional[str] = ..., reason: _Optional[str] = ..., reusable: _Optional[bool] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("run_id", "state", "tool", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: ApprovalState
    tool: str
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., tool: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "approve", "comment")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approve: bool
    comment: str
    def __init__(self, approval_id: _Optional[str] = ..., approve: _Optional[bool] = ..., comment: _Optional[str] = ...) -> None: ...

class RevokeApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ("after_sequence", "run_id", "tool", "from_now")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    FROM_NOW_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    run_id: str
    tool: str
    from_now: bool
    def __init__(self, after_sequence: _Optional[int] = ..., run_id: _Optional[str] = ..., tool: _Optional[str] = ..., from_now: _Optional[bool] = ...) -> None: ...

class ApprovalEvent(_message.Message):
    __slots__ = ("sequence", "type", "approval", "principal_id", "created_at")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    type: str
    approval: Approval
    principal_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, sequence: _Optional[int] = ..., type: _Optional[str] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ..., principal_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
