"""The sync client, ``Ledger``, and its guard: one side effect, authorized, renewed, reported.

ledger = Ledger("127.0.0.1:50051", token)
with ledger.guard(run_id, "email.send", {"to": "a@example.com"}, key="welcome-42") as effect:
    receipt = send(..., idempotency_key=effect.provider_key)
    effect.succeeded(receipt.id)
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Self

import grpc

from effect_ledger_client import _guard
from effect_ledger_client._channel import Pem, channel_credentials, channel_options
from effect_ledger_client._retry import DEFAULT_RETRY, RetryPolicy
from effect_ledger_client._services import Service, attach_services
from effect_ledger_client.errors import DeadlineExceeded, FailedPrecondition, LedgerError, Unavailable
from effect_ledger_client.outcomes import AlreadySucceeded, ApprovalTimeout, Receipt, Rejected
from effect_ledger_client.proto import approvals_pb2, gate_pb2

log = logging.getLogger("effect_ledger_client")


class Ledger:
    """A sync client. Services as attributes (``ledger.gate.AuthorizeEffect(request)``), each
    call with the bearer token, a deadline, typed exceptions and retries where safe."""

    # The services (attached from their descriptors in _services.SERVICES).
    gate: Service
    runs: Service
    tools: Service
    approvals: Service
    budgets: Service
    checkpoints: Service
    principals: Service
    retention: Service
    schedules: Service

    def __init__(
        self,
        target: str,
        token: str,
        *,
        root_certificates: Pem | None = None,
        client_certificate: Pem | None = None,
        client_key: Pem | None = None,
        timeout_seconds: float = 10.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        credentials = channel_credentials(root_certificates, client_certificate, client_key)
        all_options = channel_options(options)
        if credentials is None:
            self.channel = grpc.insecure_channel(target, options=all_options)
        else:
            self.channel = grpc.secure_channel(target, credentials, options=all_options)
        self.timeout_seconds = timeout_seconds
        attach_services(
            self,
            self.channel,
            (("authorization", f"Bearer {token}"),),
            timeout_seconds,
            retry,
            asynchronous=False,
        )

    def guard(
        self,
        run_id: str,
        tool: str,
        arguments: Mapping[str, Any] | bytes,
        *,
        key: str,
        target: str | None = None,
        estimate: Mapping[str, int] | None = None,
        approval_timeout_seconds: float = _guard.APPROVAL_TIMEOUT_SECONDS_DEFAULT,
    ) -> Guard:
        """A context manager for one effect; ``with`` gives the body its ``Effect``."""
        request = _guard.authorize_request(run_id, tool, arguments, key=key, target=target, estimate=estimate)
        return Guard(self, request, approval_timeout_seconds)

    def guarded(
        self,
        tool: str,
        *,
        run_id: str | Callable[[dict], str],
        key: Callable[[dict], str] | str,
        target: str | Callable[[dict], str] | None = None,
        arguments: Mapping[str, Any] | Callable[[dict], Mapping[str, Any]] | None = None,
        estimate: Mapping[str, int] | Callable[[dict], Mapping[str, int]] | None = None,
        approval_timeout_seconds: float = _guard.APPROVAL_TIMEOUT_SECONDS_DEFAULT,
    ) -> Callable[[Callable], Callable]:
        """Decorate a function taking an ``effect`` keyword: each call runs under ``guard``.
        ``run_id``, ``key``, ``target``, ``arguments``, ``estimate``: values, or callables given
        the call's arguments as a dict. On DUPLICATE the stored ``Receipt`` is returned and the
        function is not called."""

        def decorate(function: Callable) -> Callable:
            if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
                # Called without await, its body would run after the guard reported UNKNOWN.
                raise TypeError(f"{function.__qualname__}: Ledger.guarded decorates plain functions; use AsyncLedger")
            signature = _guard.checked_signature(function)

            @functools.wraps(function)
            def call(*args, **kwargs):
                values = _guard.call_arguments(signature, args, kwargs)
                chosen = _guard.guard_arguments(
                    values, run_id=run_id, key=key, target=target, arguments=arguments, estimate=estimate
                )
                guard = self.guard(
                    chosen.pop("run_id"),
                    tool,
                    chosen.pop("arguments"),
                    approval_timeout_seconds=approval_timeout_seconds,
                    **chosen,
                )
                try:
                    effect = guard.__enter__()
                except AlreadySucceeded as done:
                    return done.receipt
                try:
                    result = function(*args, effect=effect, **kwargs)
                except BaseException as error:
                    guard.__exit__(type(error), error, error.__traceback__)
                    raise
                guard.__exit__(None, None, None)
                return result

            return call

        return decorate

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Effect(_guard.EffectFields):
    """The allowed attempt, handed to the guarded body. Report once: ``succeeded``, ``failed``
    or ``unknown``; the guard reports UNKNOWN for a body that raises or reports nothing."""

    def __init__(self, ledger: Ledger, response) -> None:
        super().__init__(response)
        self._ledger = ledger
        self._renewer: _LeaseRenewer | None = None

    def succeeded(
        self,
        reference: str,
        detail: Mapping[str, Any] | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> Receipt:
        """SUCCEEDED with a receipt. After a lease ran out, the receipt settles the effect
        through ReconcileEffect instead (the ledger refuses the report with RECONCILE_REQUIRED)."""
        self._before_report()
        request = _guard.succeeded_request(self.attempt_id, reference, detail, usage)
        try:
            receipt = self._ledger.gate.RecordOutcome(request).attempt.receipt
        except FailedPrecondition as error:
            if error.reason != "RECONCILE_REQUIRED":
                raise
            receipt = self._ledger.gate.ReconcileEffect(
                gate_pb2.ReconcileEffectRequest(effect_id=self.effect_id, receipt=request.succeeded.receipt)
            ).receipt
        self.reported = True
        return Receipt.from_proto(receipt)

    def failed(self, reason: str) -> None:
        """FAILED: the provider answered that it did not apply the effect."""
        self._before_report()
        self._ledger.gate.RecordOutcome(_guard.failed_request(self.attempt_id, reason))
        self.reported = True

    def unknown(self, reason: str) -> None:
        """UNKNOWN: it may have happened (a timeout, a reset connection after sending)."""
        self._before_report()
        self._ledger.gate.RecordOutcome(_guard.unknown_request(self.attempt_id, reason))
        self.reported = True

    def _before_report(self) -> None:
        self._check_not_reported()
        self._stop_renewing()

    def _start_renewing(self) -> None:
        self._renewer = _LeaseRenewer(self)
        self._renewer.start()

    def _stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop(self._ledger.timeout_seconds)
            self._renewer = None


class _LeaseRenewer(threading.Thread):
    """RenewLease at a third of what is left of the lease, until stopped or the lease is lost."""

    def __init__(self, effect: Effect) -> None:
        super().__init__(name=f"effect-ledger-lease-{effect.attempt_id}", daemon=True)
        self._effect = effect
        self._stopped = threading.Event()

    def run(self) -> None:
        effect = self._effect
        request = gate_pb2.RenewLeaseRequest(attempt_id=effect.attempt_id)
        while not self._stopped.wait(_guard.renew_interval_seconds(effect.lease_expires_at)):
            try:
                response = effect._ledger.gate.RenewLease(request)
            except FailedPrecondition as error:  # lease ran out, or the attempt was settled
                effect.lease_lost = error
                log.warning("attempt %s: lease renewal refused: %r", effect.attempt_id, error)
                return
            except LedgerError as error:  # retried already; try again at the next interval
                log.warning("attempt %s: lease renewal failed: %r", effect.attempt_id, error)
                continue
            effect.lease_expires_at = _guard.lease_end(response.attempt.lease_expires_at)

    def stop(self, timeout_seconds: float) -> None:
        self._stopped.set()
        if self is not threading.current_thread():
            self.join(timeout_seconds)


class Guard:
    """One effect: authorize (waiting for an approval), renew the lease while the body runs,
    report the outcome. ``__enter__`` raises a GuardError unless the gate allows the effect."""

    def __init__(
        self, ledger: Ledger, request: gate_pb2.AuthorizeEffectRequest, approval_timeout_seconds: float
    ) -> None:
        self._ledger = ledger
        self._request = request
        self._approval_timeout_seconds = approval_timeout_seconds
        self.effect: Effect | None = None

    def __enter__(self) -> Effect:
        response = self._authorize()
        self.effect = Effect(self._ledger, response)
        self.effect._start_renewing()
        return self.effect

    def __exit__(self, exc_type, exc, traceback) -> Literal[False]:
        effect = self.effect
        if effect is None or effect.reported:
            if effect is not None:
                effect._stop_renewing()
            return False
        try:
            if isinstance(exc, Rejected):
                effect.failed(exc.reason)
            else:
                effect.unknown(_guard.exit_reason(exc))
        except LedgerError as error:
            if exc is None:
                raise
            log.error("attempt %s: the outcome could not be reported: %r", effect.attempt_id, error)
        return False

    def _authorize(self):
        deadline = time.monotonic() + self._approval_timeout_seconds
        denied_approval_id = None
        for _ in range(_guard.APPROVAL_ROUNDS_MAX):
            response = _guard.settle_answer(self._ledger.gate.AuthorizeEffect(self._request), denied_approval_id)
            if response.outcome != _guard.common_pb2.REQUIRE_APPROVAL:
                return response
            approval_id = response.approval_request_id
            if self._wait_for_decision(approval_id, deadline) == _guard.DECIDED_DENIED:
                denied_approval_id = approval_id
        raise ApprovalTimeout(approval_id, self._approval_timeout_seconds)

    def _wait_for_decision(self, approval_id: str, deadline: float) -> int:
        """The approval's state once it is decided; ApprovalTimeout at the deadline. Watches the
        run's approval events for the tool, resuming from the last sequence when a stream ends,
        and after a short backoff when the server is unavailable (a restart, a lost connection)."""
        approvals = self._ledger.approvals
        get = approvals_pb2.GetApprovalRequest(approval_id=approval_id)
        after_sequence = 0
        failures = 0  # breaks in a row
        while True:
            try:
                state = approvals.GetApproval(get).state
                if state != _guard.PENDING:
                    return state
                remaining = _guard.watch_remaining(deadline, approval_id, self._approval_timeout_seconds)
                stream = approvals.WatchApprovals(
                    _guard.watch_request(self._request.run_id, self._request.tool, after_sequence), timeout=remaining
                )
                try:
                    for event in stream:
                        after_sequence, failures = event.sequence, 0
                        if _guard.decided_state(event, approval_id) is not None:
                            stream.cancel()
                            break
                except DeadlineExceeded:
                    pass
            except Unavailable as error:
                failures += 1
                time.sleep(_guard.watch_pause(error, failures, deadline, approval_id, self._approval_timeout_seconds))
