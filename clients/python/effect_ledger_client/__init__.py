"""The Python client of the effect ledger.

    from effect_ledger_client import Ledger
    ledger = Ledger("127.0.0.1:50051", token)
    with ledger.guard(run_id, "email.send", {"to": "a@example.com"}, key="welcome-42") as effect:
        receipt = send(..., idempotency_key=effect.provider_key)
        effect.succeeded(receipt.id)

See clients/python/README.md.
"""

from effect_ledger_client._retry import RetryPolicy
from effect_ledger_client._version import PROTO_PACKAGE, __version__
from effect_ledger_client.aio import AsyncEffect, AsyncGuard, AsyncLedger
from effect_ledger_client.errors import (
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    LedgerError,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from effect_ledger_client.ledger import Effect, Guard, Ledger
from effect_ledger_client.outcomes import (
    AlreadySucceeded,
    ApprovalDenied,
    ApprovalTimeout,
    Denied,
    GuardError,
    Reason,
    Receipt,
    ReconcileRequired,
    Rejected,
)

__all__ = [
    "PROTO_PACKAGE",
    "AlreadyExists",
    "AlreadySucceeded",
    "ApprovalDenied",
    "ApprovalTimeout",
    "AsyncEffect",
    "AsyncGuard",
    "AsyncLedger",
    "Conflict",
    "DeadlineExceeded",
    "Denied",
    "Effect",
    "FailedPrecondition",
    "FieldViolation",
    "Guard",
    "GuardError",
    "Internal",
    "InvalidArgument",
    "Ledger",
    "LedgerError",
    "NotFound",
    "PermissionDenied",
    "PreconditionViolation",
    "Reason",
    "Receipt",
    "ReconcileRequired",
    "Rejected",
    "ResourceExhausted",
    "RetryPolicy",
    "Unauthenticated",
    "Unavailable",
    "__version__",
]
