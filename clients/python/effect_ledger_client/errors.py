"""Typed exceptions for every failed call, read back from the status the server sent.

    LedgerError               .code, .reason, .metadata, .violations, .retry_after_seconds
    ├── InvalidArgument       INVALID_ARGUMENT     (+ BadRequest: FieldViolation)
    ├── Unauthenticated       UNAUTHENTICATED
    ├── PermissionDenied      PERMISSION_DENIED
    ├── NotFound              NOT_FOUND
    ├── AlreadyExists         ALREADY_EXISTS
    ├── FailedPrecondition    FAILED_PRECONDITION  (+ PreconditionFailure: PreconditionViolation)
    ├── Unavailable           UNAVAILABLE          (+ RetryInfo)
    ├── Conflict              ABORTED              (+ RetryInfo)
    ├── DeadlineExceeded      DEADLINE_EXCEEDED
    ├── ResourceExhausted     RESOURCE_EXHAUSTED   (+ RetryInfo)
    └── Internal              INTERNAL
    Any other status code is a LedgerError itself.

The names mirror the server's own hierarchy (``effect_ledger/errors.py``); the reason is the
``google.rpc.ErrorInfo`` reason (domain ``effect-ledger``), or the status code's name when the
status carried none (a refused connection, a deadline the client ran out of).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request (``google.rpc.BadRequest``)."""

    field: str
    description: str


@dataclass(frozen=True)
class PreconditionViolation:
    """One precondition the ledger's state did not meet (``google.rpc.PreconditionFailure``)."""

    type: str
    subject: str
    description: str


class LedgerError(Exception):
    """A call failed. ``reason`` is stable and machine-readable; ``message`` is for people."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        violations: list[FieldViolation | PreconditionViolation] | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason or code.name
        self.metadata: dict[str, str] = dict(metadata or {})
        self.violations: list[FieldViolation | PreconditionViolation] = list(violations or [])
        # The server's RetryInfo delay; None when it sent none.
        self.retry_after_seconds = retry_after_seconds

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason}: {self.message})"


class InvalidArgument(LedgerError):
    pass


class Unauthenticated(LedgerError):
    pass


class PermissionDenied(LedgerError):
    pass


class NotFound(LedgerError):
    pass


class AlreadyExists(LedgerError):
    pass


class FailedPrecondition(LedgerError):
    pass


class Unavailable(LedgerError):
    pass


class Conflict(LedgerError):
    pass


class DeadlineExceeded(LedgerError):
    pass


class ResourceExhausted(LedgerError):
    pass


class Internal(LedgerError):
    pass


CLASS_BY_CODE: dict[grpc.StatusCode, type[LedgerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.INTERNAL: Internal,
}


def _unpack(detail, message_class):
    message = message_class()
    detail.Unpack(message)
    return message


def error_from_status(code: grpc.StatusCode, message: str, status_details: list | tuple = ()) -> LedgerError:
    """The LedgerError for a status code, its message and its packed ``google.rpc`` details."""
    reason, metadata, retry_after_seconds = "", {}, None
    violations: list[FieldViolation | PreconditionViolation] = []
    for detail in status_details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = _unpack(detail, error_details_pb2.ErrorInfo)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = _unpack(detail, error_details_pb2.BadRequest)
            violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = _unpack(detail, error_details_pb2.PreconditionFailure)
            violations += [PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            delay = _unpack(detail, error_details_pb2.RetryInfo).retry_delay
            retry_after_seconds = delay.seconds + delay.nanos / 1e9
    error_class = CLASS_BY_CODE.get(code, LedgerError)
    return error_class(
        message or code.name,
        code=code,
        reason=reason,
        metadata=metadata,
        violations=violations,
        retry_after_seconds=retry_after_seconds,
    )


def error_from_rpc(error: grpc.RpcError) -> LedgerError:
    """The LedgerError a failed call (sync or grpc.aio) stands for."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    message = error.details() if callable(getattr(error, "details", None)) else str(error)
    details: list = []
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # a status whose details do not match its code and message
        status = None
    if status is not None:
        details = list(status.details)
    return error_from_status(code, message or "", details)
