"""Every domain error maps through the one table (transport/status.py) to its gRPC status."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

# Load every module that could define an error class before walking the subclasses.
import effect_ledger.client
import effect_ledger.transport.server  # noqa: F401
from effect_ledger import errors
from effect_ledger.transport.status import ERROR_DOMAIN, internal_status, to_status

EXPECTED_CODES = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.PolicyUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StorageUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.CommitOutcomeUnknown: grpc.StatusCode.UNAVAILABLE,
    errors.Conflict: grpc.StatusCode.ABORTED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def all_subclasses(cls: type) -> list[type]:
    found = []
    for subclass in cls.__subclasses__():
        found.append(subclass)
        found.extend(all_subclasses(subclass))
    return found


# Classes the service defines (the test suites may define their own; those are not its errors).
SUBCLASSES = [c for c in all_subclasses(errors.LedgerError) if c.__module__.startswith("effect_ledger.")]


def make(error_class: type[errors.LedgerError]) -> errors.LedgerError:
    if issubclass(error_class, errors.NotFound):
        return error_class("run", "run_1")
    return error_class("something went wrong", metadata={"run_id": "run_1"})


def decode(status: grpc.Status) -> status_pb2.Status:
    (details,) = [value for key, value in status.trailing_metadata if key == "grpc-status-details-bin"]
    return status_pb2.Status.FromString(details)


def unpack(rich: status_pb2.Status) -> dict[str, object]:
    kinds = {
        "ErrorInfo": error_details_pb2.ErrorInfo,
        "BadRequest": error_details_pb2.BadRequest,
        "PreconditionFailure": error_details_pb2.PreconditionFailure,
        "ResourceInfo": error_details_pb2.ResourceInfo,
        "RetryInfo": error_details_pb2.RetryInfo,
        "QuotaFailure": error_details_pb2.QuotaFailure,
    }
    found = {}
    for packed in rich.details:
        name = packed.TypeName().rsplit(".", 1)[-1]
        message = kinds[name]()
        assert packed.Unpack(message)
        found[name] = message
    return found


def test_every_error_class_has_an_expected_code():
    assert set(SUBCLASSES) == set(EXPECTED_CODES), "a new error class needs its code in this table"


@pytest.mark.parametrize("error_class", SUBCLASSES, ids=lambda c: c.__name__)
def test_every_error_maps_to_its_code_with_error_info(error_class):
    error = make(error_class)
    status = to_status(error)
    assert status.code == EXPECTED_CODES[error_class]
    assert status.details == error.message
    rich = decode(status)
    assert rich.code == status.code.value[0]
    info = unpack(rich)["ErrorInfo"]
    assert (info.reason, info.domain) == (error.reason, ERROR_DOMAIN)
    assert dict(info.metadata) == error.metadata


def test_the_base_class_is_not_in_the_table():
    with pytest.raises(AssertionError):
        to_status(errors.LedgerError("unmapped"))


def test_invalid_argument_carries_field_violations():
    error = errors.InvalidArgument.field("arguments_json", "must be a JSON object", reason="JSON_NOT_OBJECT")
    details = unpack(decode(to_status(error)))
    assert details["ErrorInfo"].reason == "JSON_NOT_OBJECT"
    assert [(v.field, v.description) for v in details["BadRequest"].field_violations] == [
        ("arguments_json", "must be a JSON object")
    ]


def test_failed_precondition_carries_its_violations():
    error = errors.FailedPrecondition(
        "reconcile first",
        reason="RECONCILE_REQUIRED",
        violations=[errors.PreconditionViolation("EFFECT_STAGE", "effects/eff_1", "the outcome is UNKNOWN")],
    )
    (violation,) = unpack(decode(to_status(error)))["PreconditionFailure"].violations
    assert (violation.type, violation.subject, violation.description) == (
        "EFFECT_STAGE",
        "effects/eff_1",
        "the outcome is UNKNOWN",
    )


def test_not_found_carries_resource_info():
    details = unpack(decode(to_status(errors.NotFound("effect", "eff_9"))))
    assert (details["ResourceInfo"].resource_type, details["ResourceInfo"].resource_name) == (
        "effect",
        "eff_9",
    )
    assert details["ErrorInfo"].reason == "EFFECT_NOT_FOUND"


@pytest.mark.parametrize(
    ("error", "delay_ms"),
    [
        (errors.PolicyUnavailable("down"), errors.Unavailable.retry_after_ms),
        (errors.StorageUnavailable("down"), errors.Unavailable.retry_after_ms),
        (errors.Conflict("lost a race"), 100),
    ],
    ids=["policy", "storage", "conflict"],
)
def test_retryable_errors_carry_retry_info(error, delay_ms):
    delay = unpack(decode(to_status(error)))["RetryInfo"].retry_delay
    assert delay.seconds * 1000 + delay.nanos // 1_000_000 == delay_ms


def test_resource_exhausted_carries_retry_info_and_the_limit():
    error = errors.ResourceExhausted(
        "at most 4 streams per principal", subject="streams/agent-1", retry_after_ms=2500, reason="STREAMS_EXHAUSTED"
    )
    details = unpack(decode(to_status(error)))
    assert details["ErrorInfo"].reason == "STREAMS_EXHAUSTED"
    delay = details["RetryInfo"].retry_delay
    assert (delay.seconds, delay.nanos) == (2, 500_000_000)
    (violation,) = details["QuotaFailure"].violations
    assert (violation.subject, violation.description) == ("streams/agent-1", "at most 4 streams per principal")


def test_errors_without_extra_details_carry_only_error_info():
    for error in (
        errors.PermissionDenied("no"),
        errors.Unauthenticated("no"),
        errors.DeadlineExceeded("late"),
    ):
        assert set(unpack(decode(to_status(error)))) == {"ErrorInfo"}


def test_internal_status_is_generic():
    status = internal_status()
    assert status.code == grpc.StatusCode.INTERNAL and status.details == "internal error"
    rich = decode(status)
    assert rich.code == code_pb2.INTERNAL
    assert unpack(rich)["ErrorInfo"].reason == "INTERNAL"
