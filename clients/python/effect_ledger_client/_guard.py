"""What the sync and the asyncio guard share: requests, the reading of the gate's answer, the
renewal interval and the decorator's view of a call. No I/O here."""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from effect_ledger_client.outcomes import (
    AlreadySucceeded,
    ApprovalDenied,
    ApprovalTimeout,
    Denied,
    Receipt,
    ReconcileRequired,
    reasons_of,
)
from effect_ledger_client.proto import approvals_pb2, common_pb2, gate_pb2

# Renew when this share of what is left of the lease has passed: two more tries fit before it
# ends, and at least the "margin for senders" of docs/decisions.md stays.
RENEW_FRACTION = 1 / 3
# A lease already over by the client's clock (a skewed clock) is renewed at this pace.
RENEW_INTERVAL_MIN_SECONDS = 0.2
# Rounds of REQUIRE_APPROVAL -> decision -> AuthorizeEffect before the guard gives up (an
# approval that expires or is revoked makes a new request; the time bound applies as well).
APPROVAL_ROUNDS_MAX = 16
APPROVAL_TIMEOUT_SECONDS_DEFAULT = 300.0
ARGUMENTS_JSON_SIZE_MAX_BYTES = 64 * 1024
# After the server breaks the approval watch (UNAVAILABLE: a restart, a lost connection), the
# guard watches again after this backoff, doubling up to the maximum, within the approval timeout.
WATCH_BACKOFF_INITIAL_SECONDS = 0.1
WATCH_BACKOFF_MAX_SECONDS = 2.0
PENDING = approvals_pb2.PENDING
DECIDED_DENIED = approvals_pb2.DENIED


def arguments_json(arguments: Mapping[str, Any] | bytes) -> bytes:
    if isinstance(arguments, bytes):
        return arguments
    encoded = json.dumps(dict(arguments), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if len(encoded) > ARGUMENTS_JSON_SIZE_MAX_BYTES:
        raise ValueError(f"arguments: {len(encoded)} bytes of JSON, at most {ARGUMENTS_JSON_SIZE_MAX_BYTES}")
    return encoded


def authorize_request(
    run_id: str,
    tool: str,
    arguments: Mapping[str, Any] | bytes,
    *,
    key: str,
    target: str | None,
    estimate: Mapping[str, int] | None,
) -> gate_pb2.AuthorizeEffectRequest:
    if not key:
        raise ValueError("key: the idempotency key that names this effect is required")
    return gate_pb2.AuthorizeEffectRequest(
        run_id=run_id,
        tool=tool,
        arguments_json=arguments_json(arguments),
        idempotency_key=key,
        target=target or tool,
        estimate=dict(estimate or {}),
        begin_dispatched=True,
    )


def settle_answer(response, denied_approval_id: str | None = None):
    """Return the response for ALLOW and REQUIRE_APPROVAL; raise the GuardError of any other
    answer. ``denied_approval_id``: a reviewer denied this intent's approval request, so
    anything but ALLOW (or an earlier success) is that denial."""
    outcome = response.outcome
    if outcome == common_pb2.ALLOW:
        return response
    if outcome == common_pb2.DUPLICATE:
        raise AlreadySucceeded(Receipt.from_proto(response.receipt), response.effect_id)
    if outcome == common_pb2.RECONCILE_REQUIRED:
        raise ReconcileRequired(
            response.effect_id,
            common_pb2.Stage.Name(response.effect_stage),
            reasons_of(response),
            response.decision_id,
        )
    if denied_approval_id is not None:
        raise ApprovalDenied(denied_approval_id, reasons_of(response), response.decision_id)
    if outcome == common_pb2.REQUIRE_APPROVAL:
        return response
    raise Denied(reasons_of(response), response.decision_id)


def watch_request(run_id: str, tool: str, after_sequence: int) -> approvals_pb2.WatchApprovalsRequest:
    return approvals_pb2.WatchApprovalsRequest(after_sequence=after_sequence, run_id=run_id, tool=tool)


def watch_remaining(deadline: float, approval_id: str, timeout_seconds: float) -> float:
    """Seconds left to wait for the approval; ApprovalTimeout when none are."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ApprovalTimeout(approval_id, timeout_seconds)
    return remaining


def watch_pause(error: Exception, failures: int, deadline: float, approval_id: str, timeout_seconds: float) -> float:
    """After the server was unavailable (``failures`` times in a row): how long to wait before
    watching again; ApprovalTimeout (caused by ``error``) when the deadline has passed."""
    try:
        remaining = watch_remaining(deadline, approval_id, timeout_seconds)
    except ApprovalTimeout as timeout:
        raise timeout from error
    logging.getLogger("effect_ledger_client").warning("approval %s: watching again after %r", approval_id, error)
    return watch_backoff_seconds(failures, remaining)


def watch_backoff_seconds(failures: int, remaining_seconds: float) -> float:
    """How long to wait before watching again after ``failures`` breaks in a row (1-based):
    jittered, never past the approval deadline."""
    ceiling = min(WATCH_BACKOFF_MAX_SECONDS, WATCH_BACKOFF_INITIAL_SECONDS * 2 ** (failures - 1))
    return max(0.0, min(remaining_seconds, random.uniform(ceiling / 2, ceiling)))


def decided_state(event, approval_id: str) -> int | None:
    """The approval's state when ``event`` shows ``approval_id`` decided, else None."""
    approval = event.approval
    if approval.approval_id == approval_id and approval.state != PENDING:
        return approval.state
    return None


def lease_end(timestamp) -> datetime.datetime:
    return timestamp.ToDatetime(tzinfo=datetime.UTC)


def renew_interval_seconds(lease_expires_at: datetime.datetime) -> float:
    """When to renew next, on the client's clock against the lease end the server gave."""
    remaining = (lease_expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()
    return max(RENEW_INTERVAL_MIN_SECONDS, remaining * RENEW_FRACTION)


def succeeded_request(attempt_id: str, reference: str, detail, usage) -> gate_pb2.RecordOutcomeRequest:
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id,
        succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
            receipt=receipt_proto(reference, detail), usage=dict(usage or {})
        ),
    )


def receipt_proto(reference: str, detail) -> common_pb2.Receipt:
    return common_pb2.Receipt(
        provider_reference=reference,
        detail_json=arguments_json(detail) if detail is not None else b"",
    )


def failed_request(attempt_id: str, reason: str) -> gate_pb2.RecordOutcomeRequest:
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id,
        failed=gate_pb2.RecordOutcomeRequest.Failed(reason=reason, evidence=gate_pb2.PROVIDER_REJECTED),
    )


def unknown_request(attempt_id: str, reason: str) -> gate_pb2.RecordOutcomeRequest:
    return gate_pb2.RecordOutcomeRequest(
        attempt_id=attempt_id, unknown=gate_pb2.RecordOutcomeRequest.Unknown(reason=reason)
    )


def exit_reason(exception: BaseException | None) -> str:
    if exception is None:
        return "the guarded body ended without reporting an outcome"
    return f"the guarded body raised {type(exception).__name__} after dispatch"


class EffectFields:
    """The ALLOW's fields, as the body sees them."""

    def __init__(self, response) -> None:
        self.response = response
        self.effect_id: str = response.effect_id
        self.attempt_id: str = response.attempt_id
        self.provider_key: str = response.provider_idempotency_key
        self.decision_id: str = response.decision_id
        self.attempt_number: int = response.attempt_number
        self.provider_key_reused: bool = response.provider_key_reused
        self.lease_expires_at: datetime.datetime = lease_end(response.lease_expires_at)
        self.reported = False
        # The error that stopped the renewals (the lease ran out, the attempt was settled).
        self.lease_lost: Exception | None = None

    def _check_not_reported(self) -> None:
        if self.reported:
            raise RuntimeError(f"attempt {self.attempt_id}: an outcome was already reported")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(effect_id={self.effect_id!r}, attempt_id={self.attempt_id!r})"


# --- the decorator's view of a call ------------------------------------------------------------

EFFECT_PARAMETER = "effect"
Resolvable = Any  # a value, or a callable taking the call's arguments as a dict


def checked_signature(function: Callable) -> inspect.Signature:
    signature = inspect.signature(function)
    parameter = signature.parameters.get(EFFECT_PARAMETER)
    if parameter is None or parameter.kind not in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"{function.__qualname__} must take an `{EFFECT_PARAMETER}` keyword parameter")
    return signature


def call_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied, ``effect`` left out."""
    if EFFECT_PARAMETER in kwargs:
        raise TypeError(f"`{EFFECT_PARAMETER}` is given by the guard, not by the caller")
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop(EFFECT_PARAMETER, None)
    return values


def resolve(value: Resolvable, call: dict[str, Any]):
    return value(call) if callable(value) else value


def guard_arguments(call: dict[str, Any], *, run_id, key, target, arguments, estimate) -> dict[str, Any]:
    """The guard's arguments for one call of a decorated function."""
    return {
        "run_id": resolve(run_id, call),
        "arguments": call if arguments is None else resolve(arguments, call),
        "key": resolve(key, call),
        "target": resolve(target, call),
        "estimate": resolve(estimate, call),
    }
