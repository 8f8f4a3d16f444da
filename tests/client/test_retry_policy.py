"""RetryPolicy's waits and the retry decision, as pure functions (no server): full jitter under
an exponential ceiling, the server's RetryInfo delay with at most a tenth more, and which calls
and errors are repeated at all. The same rules against a real server: tests/client/test_calls.py."""

from __future__ import annotations

import random

import grpc
import pytest

from effect_ledger_client import LedgerError, RetryPolicy
from effect_ledger_client._retry import is_retryable_error, is_safe_to_retry
from effect_ledger_client.proto import runs_pb2

SAMPLES = 400


def unavailable(retry_after_seconds: float | None = None, reason: str = "UNAVAILABLE") -> LedgerError:
    return LedgerError("down", code=grpc.StatusCode.UNAVAILABLE, reason=reason, retry_after_seconds=retry_after_seconds)


@pytest.fixture(autouse=True)
def seeded():
    random.seed(20261201)


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (6, 3.2), (7, 5.0), (30, 5.0)]
)
def test_without_retry_info_the_wait_is_full_jitter_under_a_doubling_ceiling(attempt, ceiling):
    policy = RetryPolicy()  # 0.1 s doubling, at most 5 s
    waits = [policy.delay_seconds(attempt, unavailable()) for _ in range(SAMPLES)]
    assert all(0 <= wait <= ceiling for wait in waits), (min(waits), max(waits))
    # Full jitter: spread over the whole range, not bunched at the ceiling or at zero.
    assert min(waits) < ceiling * 0.1 and max(waits) > ceiling * 0.9


@pytest.mark.parametrize("delay", [0.05, 1.0, 7.5])
@pytest.mark.parametrize("attempt", [1, 5])
def test_with_retry_info_the_wait_is_the_delay_plus_at_most_a_tenth(delay, attempt):
    policy = RetryPolicy()
    waits = [policy.delay_seconds(attempt, unavailable(retry_after_seconds=delay)) for _ in range(SAMPLES)]
    assert all(delay <= wait <= delay * 1.1 for wait in waits), (min(waits), max(waits))
    assert max(waits) - min(waits) > delay * 0.05  # jittered: callers refused together spread out


def test_the_policy_refuses_bounds_that_make_no_sense():
    for bad in (
        {"attempts_max": 0},
        {"backoff_initial_seconds": 0},
        {"backoff_initial_seconds": 2.0, "backoff_max_seconds": 1.0},
        {"total_seconds_max": 0},
    ):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_which_errors_are_retried():
    assert is_retryable_error(unavailable(retry_after_seconds=1.0))
    assert is_retryable_error(LedgerError("busy", code=grpc.StatusCode.RESOURCE_EXHAUSTED, reason="RATE_LIMITED"))
    assert is_retryable_error(LedgerError("lost a race", code=grpc.StatusCode.ABORTED, reason="CONFLICT"))
    # A full quota does not drain by waiting.
    assert not is_retryable_error(
        LedgerError("quota", code=grpc.StatusCode.RESOURCE_EXHAUSTED, reason="QUOTA_EXCEEDED")
    )
    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INTERNAL):
        assert not is_retryable_error(LedgerError("no", code=code, reason="X"))


def test_which_calls_are_repeated():
    for method in ("GetEffect", "ListRuns", "CheckResumeCompatibility", "AuthorizeEffect", "RecordOutcome"):
        assert is_safe_to_retry(method, object()), method
    for method in ("ReconcileEffect", "DecideApproval", "PutToolContract", "WatchApprovals"):
        assert not is_safe_to_retry(method, object()), method
    assert is_safe_to_retry("CreateRun", runs_pb2.CreateRunRequest(request_id="ticket-1"))
    assert not is_safe_to_retry("CreateRun", runs_pb2.CreateRunRequest())
