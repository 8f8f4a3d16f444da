"""The asyncio client, ``AsyncLedger`` (grpc.aio), and its guard; the same rules as ``Ledger``.

async with AsyncLedger("127.0.0.1:50051", token) as ledger:
    async with ledger.guard(run_id, "email.send", {"to": "a@example.com"}, key="welcome-42") as effect:
        receipt = await send(..., idempotency_key=effect.provider_key)
        await effect.succeeded(receipt.id)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
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


class AsyncLedger:
    """An asyncio client: ``await ledger.gate.AuthorizeEffect(request)``; streams are async
    iterators. Create it inside the event loop that uses it."""

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
            self.channel = grpc.aio.insecure_channel(target, options=all_options)
        else:
            self.channel = grpc.aio.secure_channel(target, credentials, options=all_options)
        self.timeout_seconds = timeout_seconds
        attach_services(
            self,
            self.channel,
            (("authorization", f"Bearer {token}"),),
            timeout_seconds,
            retry,
            asynchronous=True,
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
    ) -> AsyncGuard:
        """An async context manager for one effect; ``async with`` gives the body its effect."""
        request = _guard.authorize_request(run_id, tool, arguments, key=key, target=target, estimate=estimate)
        return AsyncGuard(self, request, approval_timeout_seconds)

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
        """``Ledger.guarded`` for ``async def`` functions."""

        def decorate(function: Callable) -> Callable:
            if not asyncio.iscoroutinefunction(function):
                raise TypeError(f"{function.__qualname__}: AsyncLedger.guarded decorates async functions")
            signature = _guard.checked_signature(function)

            @functools.wraps(function)
            async def call(*args, **kwargs):
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
                    effect = await guard.__aenter__()
                except AlreadySucceeded as done:
                    return done.receipt
                try:
                    result = await function(*args, effect=effect, **kwargs)
                except BaseException as error:
                    await guard.__aexit__(type(error), error, error.__traceback__)
                    raise
                await guard.__aexit__(None, None, None)
                return result

            return call

        return decorate

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()


class AsyncEffect(_guard.EffectFields):
    """``Effect`` for ``AsyncLedger``: the reports are coroutines."""

    def __init__(self, ledger: AsyncLedger, response) -> None:
        super().__init__(response)
        self._ledger = ledger
        self._renewer: asyncio.Task | None = None

    async def succeeded(
        self,
        reference: str,
        detail: Mapping[str, Any] | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> Receipt:
        await self._before_report()
        request = _guard.succeeded_request(self.attempt_id, reference, detail, usage)
        try:
            receipt = (await self._ledger.gate.RecordOutcome(request)).attempt.receipt
        except FailedPrecondition as error:
            if error.reason != "RECONCILE_REQUIRED":
                raise
            effect = await self._ledger.gate.ReconcileEffect(
                gate_pb2.ReconcileEffectRequest(effect_id=self.effect_id, receipt=request.succeeded.receipt)
            )
            receipt = effect.receipt
        self.reported = True
        return Receipt.from_proto(receipt)

    async def failed(self, reason: str) -> None:
        await self._before_report()
        await self._ledger.gate.RecordOutcome(_guard.failed_request(self.attempt_id, reason))
        self.reported = True

    async def unknown(self, reason: str) -> None:
        await self._before_report()
        await self._ledger.gate.RecordOutcome(_guard.unknown_request(self.attempt_id, reason))
        self.reported = True

    async def _before_report(self) -> None:
        self._check_not_reported()
        await self._stop_renewing()

    def _start_renewing(self) -> None:
        self._renewer = asyncio.get_running_loop().create_task(
            self._renew(), name=f"effect-ledger-lease-{self.attempt_id}"
        )

    async def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _renew(self) -> None:
        """RenewLease at a third of what is left of the lease, until cancelled or lost."""
        request = gate_pb2.RenewLeaseRequest(attempt_id=self.attempt_id)
        while True:
            await asyncio.sleep(_guard.renew_interval_seconds(self.lease_expires_at))
            try:
                response = await self._ledger.gate.RenewLease(request)
            except FailedPrecondition as error:  # lease ran out, or the attempt was settled
                self.lease_lost = error
                log.warning("attempt %s: lease renewal refused: %r", self.attempt_id, error)
                return
            except LedgerError as error:  # retried already; try again at the next interval
                log.warning("attempt %s: lease renewal failed: %r", self.attempt_id, error)
                continue
            self.lease_expires_at = _guard.lease_end(response.attempt.lease_expires_at)


class AsyncGuard:
    """``Guard`` for ``AsyncLedger``: ``async with``."""

    def __init__(
        self, ledger: AsyncLedger, request: gate_pb2.AuthorizeEffectRequest, approval_timeout_seconds: float
    ) -> None:
        self._ledger = ledger
        self._request = request
        self._approval_timeout_seconds = approval_timeout_seconds
        self.effect: AsyncEffect | None = None

    async def __aenter__(self) -> AsyncEffect:
        response = await self._authorize()
        self.effect = AsyncEffect(self._ledger, response)
        self.effect._start_renewing()
        return self.effect

    async def __aexit__(self, exc_type, exc, traceback) -> Literal[False]:
        effect = self.effect
        if effect is None or effect.reported:
            if effect is not None:
                await effect._stop_renewing()
            return False
        try:
            if isinstance(exc, Rejected):
                await effect.failed(exc.reason)
            else:
                await effect.unknown(_guard.exit_reason(exc))
        except LedgerError as error:
            if exc is None:
                raise
            log.error("attempt %s: the outcome could not be reported: %r", effect.attempt_id, error)
        return False

    async def _authorize(self):
        deadline = time.monotonic() + self._approval_timeout_seconds
        denied_approval_id = None
        for _ in range(_guard.APPROVAL_ROUNDS_MAX):
            answer = await self._ledger.gate.AuthorizeEffect(self._request)
            response = _guard.settle_answer(answer, denied_approval_id)
            if response.outcome != _guard.common_pb2.REQUIRE_APPROVAL:
                return response
            approval_id = response.approval_request_id
            if await self._wait_for_decision(approval_id, deadline) == _guard.DECIDED_DENIED:
                denied_approval_id = approval_id
        raise ApprovalTimeout(approval_id, self._approval_timeout_seconds)

    async def _wait_for_decision(self, approval_id: str, deadline: float) -> int:
        """``Guard._wait_for_decision``: resumed from the last sequence when a stream ends, and
        after a short backoff when the server is unavailable."""
        approvals = self._ledger.approvals
        get = approvals_pb2.GetApprovalRequest(approval_id=approval_id)
        after_sequence = 0
        failures = 0  # breaks in a row
        while True:
            try:
                state = (await approvals.GetApproval(get)).state
                if state != _guard.PENDING:
                    return state
                remaining = _guard.watch_remaining(deadline, approval_id, self._approval_timeout_seconds)
                stream = approvals.WatchApprovals(
                    _guard.watch_request(self._request.run_id, self._request.tool, after_sequence), timeout=remaining
                )
                try:
                    async for event in stream:
                        after_sequence, failures = event.sequence, 0
                        if _guard.decided_state(event, approval_id) is not None:
                            stream.cancel()
                            break
                except DeadlineExceeded:
                    pass
            except Unavailable as error:
                failures += 1
                await asyncio.sleep(
                    _guard.watch_pause(error, failures, deadline, approval_id, self._approval_timeout_seconds)
                )
