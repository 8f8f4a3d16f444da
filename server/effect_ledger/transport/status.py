"""The one table from domain errors to gRPC statuses with rich error details.

Every status carries ``google.rpc.ErrorInfo(reason, domain, metadata)``, plus ``BadRequest``,
``PreconditionFailure``, ``ResourceInfo`` or ``RetryInfo`` where they fit. ``effect_ledger.client``
reads these back into the same exception classes.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from effect_ledger import errors

log = logging.getLogger(__name__)

ERROR_DOMAIN = "effect-ledger"

# class -> (gRPC code, google.rpc code). Checked in order: subclasses before their bases.
ERROR_TABLE: list[tuple[type[errors.LedgerError], grpc.StatusCode, int]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, code_pb2.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, code_pb2.PERMISSION_DENIED),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND, code_pb2.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS, code_pb2.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE),
    (errors.Conflict, grpc.StatusCode.ABORTED, code_pb2.ABORTED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, code_pb2.DEADLINE_EXCEEDED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, code_pb2.RESOURCE_EXHAUSTED),
]


def _pack(message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _details(error: errors.LedgerError) -> list[any_pb2.Any]:
    details = [
        _pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason, domain=ERROR_DOMAIN, metadata={k: str(v) for k, v in error.metadata.items()}
            )
        )
    ]
    if isinstance(error, errors.InvalidArgument) and error.violations:
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                        for v in error.violations
                    ]
                )
            )
        )
    if isinstance(error, errors.FailedPrecondition) and error.violations:
        details.append(
            _pack(
                error_details_pb2.PreconditionFailure(
                    violations=[
                        error_details_pb2.PreconditionFailure.Violation(
                            type=v.type, subject=v.subject, description=v.description
                        )
                        for v in error.violations
                    ]
                )
            )
        )
    if isinstance(error, errors.NotFound):
        details.append(
            _pack(error_details_pb2.ResourceInfo(resource_type=error.resource_type, resource_name=error.resource_name))
        )
    if isinstance(error, errors.ResourceExhausted):
        details.append(
            _pack(
                error_details_pb2.QuotaFailure(
                    violations=[
                        error_details_pb2.QuotaFailure.Violation(subject=error.subject, description=error.message)
                    ]
                )
            )
        )
    if isinstance(error, (errors.Unavailable, errors.Conflict, errors.ResourceExhausted)):
        delay_ms = getattr(error, "retry_after_ms", 100)
        details.append(
            _pack(
                error_details_pb2.RetryInfo(
                    retry_delay=duration_pb2.Duration(seconds=delay_ms // 1000, nanos=(delay_ms % 1000) * 1_000_000)
                )
            )
        )
    return details


def to_status(error: errors.LedgerError) -> grpc.Status:
    for error_class, _grpc_code, rpc_code in ERROR_TABLE:
        if isinstance(error, error_class):
            return rpc_status.to_status(
                status_pb2.Status(code=rpc_code, message=error.message, details=_details(error))
            )
    raise AssertionError(f"{type(error).__name__} is missing from ERROR_TABLE")


def internal_status() -> grpc.Status:
    return rpc_status.to_status(
        status_pb2.Status(
            code=code_pb2.INTERNAL,
            message="internal error",
            details=[_pack(error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN))],
        )
    )


def reason_of(answer: grpc.Status) -> str:
    """The ErrorInfo reason a status carries; "" when it carries none."""
    for key, value in answer.trailing_metadata or ():
        if key == "grpc-status-details-bin":
            carried = status_pb2.Status.FromString(value)
            for detail in carried.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info.reason
    return ""
