"""Which calls may be repeated, and how long to wait before each repeat.

A call is retried only when repeating it cannot do anything twice:

- reads (``Get*``, ``List*``, ``CheckResumeCompatibility``);
- ``AuthorizeEffect``: its idempotency key names one effect, so a repeat never starts a second
  one. The server does not replay the first answer: it decides the repeat again against what the
  first call committed. After a lost ALLOW the attempt it opened is still open (DISPATCHED with
  ``begin_dispatched``), so the repeat gets RECONCILE_REQUIRED, or, for a tool whose contract
  allows RETRY_SAME_KEY, a new attempt under the same provider key (while ``max_attempts``
  allows); after a success, DUPLICATE with the receipt;
- ``RecordDispatch``, ``RecordOutcome``, ``RenewLease``, ``ReleaseAttempt``: on the same attempt a
  repeated report changes nothing (stages never regress);
- ``CreateRun`` with a ``request_id`` (which names one run).

Everything else is called once: ``CreateRun`` without ``request_id`` would create a second run,
``DecideApproval`` would vote twice, a repeated ``ReconcileEffect`` could settle an attempt
authorized after the first one settled the effect (the same evidence on a settled effect is
answered unchanged, but a new open attempt would take it), and streams are not restarted (the
guard resumes its approval watch itself).

Retried on UNAVAILABLE, RESOURCE_EXHAUSTED (not ``QUOTA_EXCEEDED``: a full quota does not drain
by waiting) and ABORTED, after the server's ``RetryInfo`` delay when it sent one, else a
jittered exponential backoff; bounded in attempts and in total time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from effect_ledger_client.errors import LedgerError

RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})
NEVER_RETRIED_REASONS = frozenset({"QUOTA_EXCEEDED"})
IDEMPOTENT_BY_ATTEMPT = frozenset(
    {"AuthorizeEffect", "RecordDispatch", "RecordOutcome", "RenewLease", "ReleaseAttempt"}
)
READS_OTHER = frozenset({"CheckResumeCompatibility"})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds for retrying the calls that are safe to retry. ``attempts_max=1``: no retries."""

    attempts_max: int = 5
    backoff_initial_seconds: float = 0.1
    backoff_max_seconds: float = 5.0
    # The whole call, every attempt and wait included, gives up after this long.
    total_seconds_max: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts_max < 1:
            raise ValueError("attempts_max must be at least 1")
        if self.backoff_initial_seconds <= 0 or self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoffs must be positive, the maximum at least the initial one")
        if self.total_seconds_max <= 0:
            raise ValueError("total_seconds_max must be positive")

    def delay_seconds(self, attempt: int, error: LedgerError) -> float:
        """How long to wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.backoff_max_seconds, self.backoff_initial_seconds * 2 ** (attempt - 1))
        backoff = random.uniform(0, ceiling)  # full jitter
        if error.retry_after_seconds is not None:
            # The server named the delay: wait it out, plus a little jitter so that callers
            # refused together do not come back together.
            return error.retry_after_seconds + random.uniform(0, 0.1 * error.retry_after_seconds)
        return backoff


DEFAULT_RETRY = RetryPolicy()


def is_safe_to_retry(method: str, request: object) -> bool:
    """Whether ``method`` with this request may be sent again without doing anything twice."""
    if method.startswith(("Get", "List")) or method in READS_OTHER:
        return True
    if method in IDEMPOTENT_BY_ATTEMPT:
        return True
    if method == "CreateRun":
        return bool(getattr(request, "request_id", ""))
    return False


def is_retryable_error(error: LedgerError) -> bool:
    return error.code in RETRIED_CODES and error.reason not in NEVER_RETRIED_REASONS
