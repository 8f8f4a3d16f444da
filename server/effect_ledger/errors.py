"""The one error hierarchy of the service.

Every error carries an UPPER_SNAKE ``reason`` and structured fields; ``transport/status.py``
holds the one table that maps each class to a gRPC status code and its error details, and
``effect_ledger.client`` turns those details back into these classes.

    LedgerError
    ├── InvalidArgument           bad client input            INVALID_ARGUMENT (+ BadRequest)
    ├── Unauthenticated           no or unknown bearer token  UNAUTHENTICATED
    ├── PermissionDenied          role without authority      PERMISSION_DENIED
    ├── NotFound                  absent, or another tenant's NOT_FOUND (+ ResourceInfo)
    ├── AlreadyExists                                         ALREADY_EXISTS
    ├── FailedPrecondition        the ledger's state forbids  FAILED_PRECONDITION (+ PreconditionFailure)
    ├── Unavailable               fail closed                 UNAVAILABLE (+ RetryInfo)
    │   ├── PolicyUnavailable     POLICY_UNAVAILABLE / POLICY_UNDEFINED
    │   ├── StorageUnavailable    STORAGE_UNAVAILABLE (nothing was written)
    │   └── CommitOutcomeUnknown  COMMIT_OUTCOME_UNKNOWN (the commit may have landed)
    ├── Conflict                  a concurrent writer won     ABORTED (+ RetryInfo); retried inside
    └── DeadlineExceeded                                      DEADLINE_EXCEEDED

Anything else that escapes a handler becomes INTERNAL with a generic message and a logged trace.
Every reason code, with the class it is raised as and what a caller should do, is listed in
``reasons.py`` (docs/errors.md is generated from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class LedgerError(Exception):
    """Base class. ``reason`` is stable and machine-readable; ``message`` is for people."""

    default_reason = "LEDGER_ERROR"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason}: {self.message})"


class InvalidArgument(LedgerError):
    default_reason = "INVALID_ARGUMENT"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        violations: list[FieldViolation] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.violations: list[FieldViolation] = list(violations or [])

    @classmethod
    def field(cls, field_name: str, description: str, *, reason: str | None = None) -> InvalidArgument:
        return cls(
            f"{field_name}: {description}",
            reason=reason,
            violations=[FieldViolation(field_name, description)],
        )


class Unauthenticated(LedgerError):
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(LedgerError):
    default_reason = "PERMISSION_DENIED"


class NotFound(LedgerError):
    default_reason = "NOT_FOUND"

    def __init__(self, resource_type: str, resource_name: str, *, reason: str | None = None) -> None:
        super().__init__(
            f"{resource_type} {resource_name!r} not found",
            reason=reason or f"{resource_type.upper()}_NOT_FOUND",
            metadata={"resource_type": resource_type, "resource_name": resource_name},
        )
        self.resource_type = resource_type
        self.resource_name = resource_name


class AlreadyExists(LedgerError):
    default_reason = "ALREADY_EXISTS"


@dataclass(frozen=True)
class PreconditionViolation:
    type: str
    subject: str
    description: str


class FailedPrecondition(LedgerError):
    default_reason = "FAILED_PRECONDITION"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        violations: list[PreconditionViolation] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.violations: list[PreconditionViolation] = list(violations or [])


class Unavailable(LedgerError):
    default_reason = "UNAVAILABLE"
    retry_after_ms = 1000


class PolicyUnavailable(Unavailable):
    """The policy engine could not give a valid decision: the gate fails closed."""

    default_reason = "POLICY_UNAVAILABLE"


class StorageUnavailable(Unavailable):
    default_reason = "STORAGE_UNAVAILABLE"


class CommitOutcomeUnknown(Unavailable):
    """The connection broke while COMMIT was in flight: the write may or may not be durable.

    Clients treat it like a timeout: the call may have happened. Retrying with the same
    idempotency key is safe; the ledger answers from what was committed.
    """

    default_reason = "COMMIT_OUTCOME_UNKNOWN"


class Conflict(LedgerError):
    """A concurrent transaction won a race; the unit of work is retried from the start."""

    default_reason = "CONCURRENT_UPDATE"


class DeadlineExceeded(LedgerError):
    default_reason = "DEADLINE_EXCEEDED"


class ResourceExhausted(LedgerError):
    """A limit of the caller's was reached (streams, concurrent calls, a quota): retry later.

    ``subject`` names the limit (QuotaFailure); ``retry_after_ms`` is the delay RetryInfo gives.
    """

    default_reason = "RESOURCE_EXHAUSTED"

    def __init__(
        self,
        message: str,
        *,
        subject: str = "",
        retry_after_ms: int = 1000,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.subject = subject
        self.retry_after_ms = retry_after_ms


@dataclass
class CommitThenRaise(Exception):
    """Raised by a use case whose writes must be committed although the call fails.

    Example: a conflicting terminal report is refused, but both reports stay in the trace.
    The unit of work commits, then raises ``error``.
    """

    error: LedgerError
    details: dict[str, str] = field(default_factory=dict)
