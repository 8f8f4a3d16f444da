"""The guard every RPC passes, unary or streaming, before and after its servicer.

- **Authentication first.** A call without a well-formed bearer token is refused before its
  servicer runs. A streaming call is authenticated against the database before its first
  request message is read or its first response written. A unary call authenticates inside its
  unit of work (``Application.call``, or the fast paths' first round trip); when it fails
  before that point (a malformed field), the guard authenticates the token first, so an
  unauthenticated caller learns nothing but UNAUTHENTICATED.
- **Admission.** Each bearer token makes at most ``Limits.requests_per_second_per_token``
  calls a second (bursts of ``request_burst_per_token``), at most ``maximum_concurrent_rpcs``
  calls run at once in this process, at most ``Limits.calls_per_tenant_max`` of them for one
  tenant, at most ``Limits.streams_per_principal_max`` streams per principal, and at most
  ``WATCHERS_PER_TENANT_MAX`` WatchApprovals streams per tenant; the rest get
  RESOURCE_EXHAUSTED with RetryInfo. All are counted per server process. Health checks and
  reflection are never counted or refused.
- **A tenant's share.** A call's tenant is known only once its token is checked (by the guard
  for a stream; inside the call's unit of work, or a fast path's first round trip, for a unary
  call). At that moment (``authenticated_as`` and ``calls.identify`` both call
  ``CallState.identify``, which ``GuardedCall`` extends) the call takes one of its tenant's slots, or is refused with TENANT_BUSY; it gives
  the slot back when it ends, however it ends. So one tenant's slow calls hold at most its
  share of the process's slots, never all of them. A token this process has seen check out
  takes its tenant's slot at admission already, when one is free (``GuardedCall.claim``), so
  the work a call does before its unit of work counts too.
- **Deadlines.** A call without a deadline gets the default one; no stream outlives
  ``Limits.stream_lifetime_max_seconds``: WatchApprovals then ends normally (the client resumes
  from its cursor), the others end with DEADLINE_EXCEEDED.
- **Errors.** Domain errors become statuses through the one table (``status.py``); anything
  else becomes INTERNAL with a generic message, logged here. No exception text reaches a client.
  An UNAVAILABLE answer (the policy engine, the database) is logged here with its cause.
- **Observed.** Each call has a request id: the caller's ``x-request-id`` when it is a valid
  one, otherwise a new one; it goes back in the trailing metadata, on success and on error, and
  is on every line logged during the call. When the call ends, the observer writes its access
  line and counts it (``observability/observer.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from effect_ledger import faults
from effect_ledger.config import Limits
from effect_ledger.domain.model import Principal
from effect_ledger.domain.tokens import token_hash
from effect_ledger.errors import (
    DeadlineExceeded,
    LedgerError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from effect_ledger.observability import calls, logs, tracing
from effect_ledger.observability.calls import REQUEST_ID_KEY, CallState
from effect_ledger.observability.observer import Observer
from effect_ledger.storage import notifications, round_trips
from effect_ledger.transport import peer, status

log = logging.getLogger(__name__)
failures = logs.get_logger(__name__)

# Services every caller may use without a token, never counted or refused by admission.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
# Streams that end normally at their lifetime: the client resumes from its cursor.
RESUMABLE_STREAMS = frozenset(
    {"/effectledger.v1.Approvals/WatchApprovals", "/effectledger.v1.Schedules/WatchDueIntents"}
)
TOKEN_LENGTH_MAX = 512
BUSY_RETRY_MS = 200
WATCH_APPROVALS = "/effectledger.v1.Approvals/WatchApprovals"
# WatchApprovals streams one tenant may hold in a process: half of the process's watchers, so
# that one tenant (with many principals, and a --calls-per-tenant-max raised past it) never
# holds every one.
WATCHERS_PER_TENANT_MAX = notifications.WATCHERS_MAX // 2
STREAMS_RETRY_MS = 5000
# Token buckets kept per process (the least recently used beyond this are forgotten: a
# forgotten caller starts again with a full bucket).
RATE_BUCKETS_MAX = 10_000


class RateLimiter:
    """Requests per second per bearer token, as token buckets (``rate`` per second, ``burst``
    at most): a call spends one token; with none left it is refused until one is back.
    ``rate`` 0: unlimited. Keyed by the token's hash, before authentication, so a flood is
    refused without a database read."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def wait_ms(self, key: str) -> int:
        """0 when the call may go ahead (and is counted); otherwise how long until it may.
        ``key``: the token's hash."""
        if self.rate <= 0:
            return 0
        now = self.clock()
        level, last = self.buckets.pop(key, (float(self.burst), now))
        level = min(float(self.burst), level + (now - last) * self.rate)
        waiting = 0
        if level >= 1.0:
            level -= 1.0
        else:
            waiting = max(1, int((1.0 - level) / self.rate * 1000))
        self.buckets[key] = (level, now)
        while len(self.buckets) > RATE_BUCKETS_MAX:
            self.buckets.popitem(last=False)
        return waiting


class TenantSlots:
    """Calls in flight per tenant in this process, at most ``cap`` each."""

    def __init__(self, cap: int, what: str = "calls", setting: str = "calls_per_tenant_max") -> None:
        self.cap = max(1, cap)
        self.what = what
        self.setting = setting
        self.counts: dict[str, int] = {}

    def take(self, tenant_id: str) -> None:
        """One more for the tenant, or TENANT_BUSY when it holds its cap."""
        held = self.counts.get(tenant_id, 0)
        if held >= self.cap:
            raise ResourceExhausted(
                f"a tenant runs at most {self.cap} {self.what} at once on each server process; retry shortly",
                subject=f"tenants/{tenant_id}/{self.what.replace(' ', '-')}",
                retry_after_ms=BUSY_RETRY_MS,
                reason="TENANT_BUSY",
                metadata={self.setting: str(self.cap)},
            )
        self.counts[tenant_id] = held + 1

    def give_back(self, tenant_id: str) -> None:
        left = self.counts[tenant_id] - 1
        if left:
            self.counts[tenant_id] = left
        else:
            del self.counts[tenant_id]


class GuardedCall(CallState):
    """A guarded call's state. When the call is identified (its token checked out, on whatever
    path), it takes one of its tenant's slots, or TENANT_BUSY is raised; ``release`` gives the
    slot back and ends the counting (the guard's own identification of a failed call,
    afterwards, takes nothing)."""

    def __init__(self, method: str, request_id: str, tenants: TenantSlots | None) -> None:
        super().__init__(method=method, request_id=request_id)
        self._tenants = tenants
        self._held: str | None = None

    def identify(self, tenant_id: str, principal_id: str) -> None:
        super().identify(tenant_id, principal_id)
        if not tenant_id or self._tenants is None or self._held == tenant_id:
            return
        if self._held is not None:  # claimed for another tenant: a hint that was wrong
            self._tenants.give_back(self._held)
            self._held = None
        self._tenants.take(tenant_id)
        self._held = tenant_id

    def claim(self, tenant_id: str) -> None:
        """Before the token is checked: take a slot of the tenant the token belonged to when
        last checked, if one is free (the work a call does before its unit of work, such as an
        early argument check, then counts too). A full tenant refuses nothing here: the call is
        refused once its token is checked, so a caller whose token is no longer valid hears
        UNAUTHENTICATED, not how busy its former tenant is."""
        if self._tenants is None or self._held is not None:
            return
        with contextlib.suppress(ResourceExhausted):
            self._tenants.take(tenant_id)
            self._held = tenant_id

    def release(self) -> None:
        if self._tenants is not None and self._held is not None:
            self._tenants.give_back(self._held)
        self._tenants, self._held = None, None


def authenticated_as(principal: Principal) -> None:
    """The call in progress has authenticated (its errors may now speak of its request)."""
    state = calls.current.get()
    if state is not None:
        state.principal_id = principal.principal_id
        state.identify(principal.tenant_id, principal.principal_id)  # may refuse the call (GuardedCall)


def bearer_token(metadata: Any) -> str | None:
    """The bearer token of the call's metadata, or None when missing or malformed."""
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = str(value).partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token and len(token) <= TOKEN_LENGTH_MAX:
                return token
            return None
    return None


def missing_token() -> Unauthenticated:
    return Unauthenticated("send metadata 'authorization: Bearer <token>'", reason="TOKEN_MISSING")


Authenticator = Callable[[str, str | None], Awaitable[Principal]]


class Guard(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        default_deadline_seconds: float,
        maximum_concurrent_rpcs: int,
        limits: Limits,
        authenticate: Authenticator,
        observer: Observer | None = None,
    ) -> None:
        self.default_deadline_seconds = default_deadline_seconds
        self.observer = observer or Observer()
        self.maximum_concurrent_rpcs = maximum_concurrent_rpcs
        self.limits = limits
        self.authenticate = authenticate
        self.rates = RateLimiter(limits.requests_per_second_per_token, limits.request_burst_per_token)
        self.in_flight = 0
        self.streams: dict[tuple[str, str], int] = {}
        self.tenants = TenantSlots(limits.calls_per_tenant_max)
        # The tenant of each token that checked out recently (by the token's hash; the least
        # recently used beyond RATE_BUCKETS_MAX forgotten): a token belongs to one tenant for life.
        self.token_tenants: OrderedDict[str, str] = OrderedDict()
        self.watchers = TenantSlots(WATCHERS_PER_TENANT_MAX, "WatchApprovals streams", "watchers_per_tenant_max")

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if round_trips.enabled and handler is not None:
            # This call's task (unary or streaming) runs its handler after this returns.
            round_trips.begin_call(method)
        if handler is None or method.lstrip("/").split("/", 1)[0] in OPEN_SERVICES:
            return handler
        metadata = handler_call_details.invocation_metadata
        token = bearer_token(metadata)
        call = (method.lstrip("/"), calls.request_id_of(metadata))
        name = method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, name, token, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._server_stream(handler.unary_stream, method, token, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._client_stream(handler.stream_unary, name, token, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return _refusing_stream_stream(handler)

    # --- admission ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _admitted(self, token: str | None, state: GuardedCall):
        """The call's global slot; its tenant's slot is taken once its tenant is known
        (``GuardedCall``) and given back here with the global one."""
        key = token_hash(token) if token is not None else None
        if key is not None:
            wait_ms = self.rates.wait_ms(key)
            if wait_ms:
                raise ResourceExhausted(
                    f"at most {self.rates.rate:g} requests per second per token (bursts of {self.rates.burst})",
                    subject="tokens/requests-per-second",
                    retry_after_ms=wait_ms,
                    reason="RATE_LIMITED",
                    metadata={"requests_per_second": f"{self.rates.rate:g}", "burst": str(self.rates.burst)},
                )
        if self.in_flight >= self.maximum_concurrent_rpcs:
            raise ResourceExhausted(
                f"the server runs at most {self.maximum_concurrent_rpcs} calls at once; retry shortly",
                subject="server/concurrent-calls",
                retry_after_ms=BUSY_RETRY_MS,
                reason="SERVER_BUSY",
                metadata={"maximum_concurrent_rpcs": str(self.maximum_concurrent_rpcs)},
            )
        self.in_flight += 1
        hinted = self.token_tenants.get(key) if key is not None else None
        if hinted is not None:
            state.tenant_hint = hinted
            state.claim(hinted)
        try:
            yield
        finally:
            self.in_flight -= 1
            state.release()
            if key is not None and state.caller_id and state.tenant_id:  # its token checked out
                self.token_tenants[key] = state.tenant_id
                self.token_tenants.move_to_end(key)
                while len(self.token_tenants) > RATE_BUCKETS_MAX:
                    self.token_tenants.popitem(last=False)

    @contextlib.contextmanager
    def _watcher_slot(self, method: str, principal: Principal):
        if method != WATCH_APPROVALS:
            yield
            return
        self.watchers.take(principal.tenant_id)
        try:
            yield
        finally:
            self.watchers.give_back(principal.tenant_id)

    @contextlib.contextmanager
    def _stream_slot(self, principal: Principal):
        # A principal id names a principal within its tenant ("agent" may be in every tenant).
        key = (principal.tenant_id, principal.principal_id)
        cap = self.limits.streams_per_principal_max
        if self.streams.get(key, 0) >= cap:
            raise ResourceExhausted(
                f"at most {cap} streams are open per principal on each server process",
                subject=f"principals/{principal.principal_id}/streams",
                retry_after_ms=STREAMS_RETRY_MS,
                reason="STREAMS_EXHAUSTED",
                metadata={"streams_per_principal_max": str(cap)},
            )
        self.streams[key] = self.streams.get(key, 0) + 1
        try:
            yield
        finally:
            left = self.streams[key] - 1
            if left:
                self.streams[key] = left
            else:
                del self.streams[key]

    async def _stream_principal(self, token: str | None, context) -> Principal:
        if token is None:
            raise missing_token()
        principal = await self.authenticate(token, peer.client_subject(context))
        authenticated_as(principal)
        return principal

    def _begin(self, name: str, call: tuple[str, str]) -> GuardedCall:
        """A new call: its method name for the fault points, and its state (full method name,
        request id; counted against its tenant's slots once its tenant is known), in this
        task's context."""
        faults.current_method.set(name)
        state = GuardedCall(call[0], call[1], self.tenants)
        if tracing.enabled():
            state.trace_id = tracing.annotate_call(state.request_id)
        calls.current.set(state)
        return state

    # --- errors ---------------------------------------------------------------------------

    async def _refusal(
        self, error: BaseException, token: str | None, state: CallState, name: str, context
    ) -> grpc.Status:
        """The status a failed call answers; an unauthenticated caller only ever hears that."""
        if state.principal_id is None and not isinstance(error, (Unauthenticated, PermissionDenied, ResourceExhausted)):
            try:
                if token is None:
                    raise missing_token()
                principal = await self.authenticate(token, peer.client_subject(context))
                calls.identify(principal.tenant_id, principal.principal_id)
            except LedgerError as refused:
                return _answer(refused, state)
            except Exception:  # the original error is reported below
                log.exception("authenticating after a failure in %s", name)
        if isinstance(error, LedgerError):
            return _answer(error, state)
        log.error("unhandled error in %s", name, exc_info=error)
        state.code, state.reason = grpc.StatusCode.INTERNAL.name, "INTERNAL"
        return status.internal_status()

    def _deadline(self, context: grpc.aio.ServicerContext, cap: float | None = None) -> float | None:
        """Seconds this call may run for, or None when the caller's own deadline applies."""
        remaining = context.time_remaining()
        if remaining is None:
            return self.default_deadline_seconds if cap is None else min(cap, self.default_deadline_seconds)
        if cap is not None and remaining > cap:
            return cap
        return None

    # --- the three kinds of calls ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _answering(self, context, token: str | None, state: CallState, name: str):
        """Every failure of the call becomes its status: a domain error through the table,
        anything else INTERNAL (logged); cancellations and aborts pass through. The trailing
        metadata carries the request id either way; the observer hears how the call ended."""
        started = time.perf_counter()
        request_id = ((REQUEST_ID_KEY, state.request_id),)
        context.set_trailing_metadata(request_id)
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            state.code = grpc.StatusCode.CANCELLED.name
            raise
        except grpc.aio.AbortError:
            if state.code == "OK":  # an abort that did not go through _StreamContext
                state.code = grpc.StatusCode.UNKNOWN.name
            raise
        except Exception as error:  # noqa: BLE001 - mapped by _refusal
            answer = await self._refusal(error, token, state, name, context)
            await context.abort(answer.code, answer.details, (*answer.trailing_metadata, *request_id))
        finally:
            self.observer.finish(state, time.perf_counter() - started)

    @staticmethod
    async def _within(awaitable, seconds: float | None, what: str):
        """``awaitable``'s result, or DEADLINE_EXCEEDED after ``seconds`` (None: the caller's
        own deadline, which gRPC enforces)."""
        if seconds is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, seconds)
        except TimeoutError:
            raise DeadlineExceeded(f"{what} did not finish within {seconds} s") from None

    def _unary(self, inner, name: str, token: str | None, call: tuple[str, str]):
        async def guarded(request, context):
            state = self._begin(name, call)
            async with self._answering(context, token, state, name):
                if token is None:
                    raise missing_token()
                with self._admitted(token, state):
                    response = await self._within(inner(request, context), self._deadline(context), name)
                faults.crash_point("after_commit")
                state.response = response
                return response

        return guarded

    def _server_stream(self, inner, method: str, token: str | None, call: tuple[str, str]):
        name = method.rsplit("/", 1)[-1]
        resumable = method in RESUMABLE_STREAMS
        lifetime = self.limits.stream_lifetime_max_seconds

        async def guarded(request, context):
            state = self._begin(name, call)
            responses: AsyncIterator[Any] | None = None
            async with self._answering(context, token, state, name):
                try:
                    with self._admitted(token, state):
                        principal = await self._stream_principal(token, context)
                        with self._stream_slot(principal), self._watcher_slot(method, principal):
                            seconds = lifetime if resumable else self._deadline(context, lifetime)
                            loop = asyncio.get_running_loop()
                            ends_at = None if seconds is None else loop.time() + seconds
                            responses = inner(request, _StreamContext(context, state)).__aiter__()
                            while True:
                                left = None if ends_at is None else ends_at - loop.time()
                                if left is not None and left <= 0:
                                    raise TimeoutError
                                try:
                                    next_response = responses.__anext__()
                                    if left is None:
                                        response = await next_response
                                    else:
                                        response = await asyncio.wait_for(next_response, left)
                                except StopAsyncIteration:
                                    return
                                yield response
                except TimeoutError:
                    if resumable:
                        return  # the stream's lifetime: the client resumes from its last sequence
                    raise DeadlineExceeded(f"{name} did not finish within its deadline") from None
                finally:
                    if responses is not None:
                        with contextlib.suppress(Exception):
                            await responses.aclose()  # type: ignore[attr-defined]

        return guarded

    def _client_stream(self, inner, name: str, token: str | None, call: tuple[str, str]):
        lifetime = self.limits.stream_lifetime_max_seconds

        async def guarded(request_iterator, context):
            state = self._begin(name, call)
            async with self._answering(context, token, state, name):
                with self._admitted(token, state):
                    # Before a single request message is read.
                    principal = await self._stream_principal(token, context)
                    with self._stream_slot(principal):
                        seconds = self._deadline(context, lifetime)
                        streamed = inner(request_iterator, _StreamContext(context, state))
                        return await self._within(streamed, seconds, name)

        return guarded


def _answer(error: LedgerError, state: CallState) -> grpc.Status:
    """``error``'s status, noted in the call's state; an UNAVAILABLE one is logged with its
    cause (which the client is never told)."""
    answer = status.to_status(error)
    state.code, state.reason = answer.code.name, error.reason
    if isinstance(error, Unavailable):
        failures.warning(
            "call failed", method=state.method, reason=error.reason, error=error.message, cause=logs.cause_of(error)
        )
    return answer


class _StreamContext:
    """A stream's servicer context: its own aborts (``abort_with_status``) keep the request id
    in the trailing metadata and tell the guard how the call ended."""

    def __init__(self, context: Any, state: CallState) -> None:
        self._context = context
        self._state = state

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._context, attribute)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        if self._state.code == "OK":
            self._state.code = code.name
        request_id = ((REQUEST_ID_KEY, self._state.request_id),)
        await self._context.abort(code, details, (*tuple(trailing_metadata or ()), *request_id))

    async def abort_with_status(self, answer: grpc.Status) -> None:
        self._state.code, self._state.reason = answer.code.name, status.reason_of(answer)
        await self.abort(answer.code, answer.details, answer.trailing_metadata)


def _refusing_stream_stream(handler):
    """No service has a bidirectional stream; one added without a guard is refused, not open."""

    async def refused(request_iterator, context):
        log.error("a bidirectional stream has no guard: refused")
        await context.abort_with_status(status.internal_status())

    return grpc.stream_stream_rpc_method_handler(
        refused, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
