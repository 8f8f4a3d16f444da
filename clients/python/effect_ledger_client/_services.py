"""The services as attributes of a client: generated stubs with the bearer token, a deadline
on every call, typed exceptions (streams included) and retries where they are safe."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from effect_ledger_client._retry import RetryPolicy, is_retryable_error, is_safe_to_retry
from effect_ledger_client.errors import LedgerError, error_from_rpc
from effect_ledger_client.proto import (
    approvals_pb2,
    approvals_pb2_grpc,
    budgets_pb2,
    budgets_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    principals_pb2,
    principals_pb2_grpc,
    retention_pb2,
    retention_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)

Metadata = tuple[tuple[str, str], ...]

# client attribute -> (generated stub class, the service's descriptor)
SERVICES = {
    "gate": (gate_pb2_grpc.GateStub, gate_pb2.DESCRIPTOR.services_by_name["Gate"]),
    "runs": (runs_pb2_grpc.RunsStub, runs_pb2.DESCRIPTOR.services_by_name["Runs"]),
    "tools": (tools_pb2_grpc.ToolRegistryStub, tools_pb2.DESCRIPTOR.services_by_name["ToolRegistry"]),
    "approvals": (approvals_pb2_grpc.ApprovalsStub, approvals_pb2.DESCRIPTOR.services_by_name["Approvals"]),
    "budgets": (budgets_pb2_grpc.BudgetsStub, budgets_pb2.DESCRIPTOR.services_by_name["Budgets"]),
    "checkpoints": (
        checkpoints_pb2_grpc.CheckpointsStub,
        checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"],
    ),
    "principals": (
        principals_pb2_grpc.PrincipalsStub,
        principals_pb2.DESCRIPTOR.services_by_name["Principals"],
    ),
    "retention": (
        retention_pb2_grpc.RetentionStub,
        retention_pb2.DESCRIPTOR.services_by_name["Retention"],
    ),
    "schedules": (
        schedules_pb2_grpc.SchedulesStub,
        schedules_pb2.DESCRIPTOR.services_by_name["Schedules"],
    ),
}


class _CallSettings:
    def __init__(self, metadata: Metadata, timeout_seconds: float, retry: RetryPolicy) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.metadata = metadata
        self.timeout_seconds = timeout_seconds
        self.retry = retry


class _Retrying:
    """The retry loop's bookkeeping: whether to go again after ``error``, and after how long."""

    def __init__(self, name: str, request: object, retry: RetryPolicy) -> None:
        self.safe = is_safe_to_retry(name, request)
        self.retry = retry
        self.started = time.monotonic()
        self.attempt = 0

    def delay_before_next(self, error: LedgerError) -> float | None:
        """Seconds to wait before the next attempt, or None: give up and raise ``error``."""
        self.attempt += 1
        if not (self.safe and is_retryable_error(error)) or self.attempt >= self.retry.attempts_max:
            return None
        delay = self.retry.delay_seconds(self.attempt, error)
        if time.monotonic() - self.started + delay > self.retry.total_seconds_max:
            return None
        return delay


# --- sync -------------------------------------------------------------------------------------


class Stream:
    """A server stream whose failures are LedgerErrors. Iterate it; ``cancel()`` ends it."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Stream:
        return self

    def __next__(self):
        try:
            return next(self._call)
        except grpc.RpcError as rpc_error:
            raise error_from_rpc(rpc_error) from None

    def cancel(self) -> None:
        self._call.cancel()


def _sync_method(stub: Any, method, settings: _CallSettings):
    callable_ = getattr(stub, method.name)
    name = method.name

    if method.server_streaming:

        def open_stream(request, *, timeout: float | None = None) -> Stream:
            call = callable_(request, metadata=settings.metadata, timeout=timeout or settings.timeout_seconds)
            return Stream(call)

        return open_stream

    def call(request, *, timeout: float | None = None):
        retrying = _Retrying(name, request, settings.retry)
        while True:
            try:
                return callable_(request, metadata=settings.metadata, timeout=timeout or settings.timeout_seconds)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            delay = None if method.client_streaming else retrying.delay_before_next(error)
            if delay is None:
                raise error
            time.sleep(delay)

    return call


class Service:
    """One service of the ledger: each RPC is a method named as in the proto."""

    def __init__(self, stub: Any, descriptor, settings: _CallSettings, *, asynchronous: bool) -> None:
        self._names = [method.name for method in descriptor.methods]
        make = _async_method if asynchronous else _sync_method
        for method in descriptor.methods:
            setattr(self, method.name, make(stub, method, settings))

    def __dir__(self):
        return [*super().__dir__(), *self._names]

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name that is not an RPC of the service (the RPCs are attributes).
        raise AttributeError(f"the service has no RPC {name!r}; it has {', '.join(self._names)}")


def attach_services(
    client: Any, channel: Any, metadata: Metadata, timeout_seconds: float, retry: RetryPolicy, *, asynchronous: bool
) -> None:
    settings = _CallSettings(metadata, timeout_seconds, retry)
    for attribute, (stub_class, descriptor) in SERVICES.items():
        setattr(client, attribute, Service(stub_class(channel), descriptor, settings, asynchronous=asynchronous))


# --- asyncio ----------------------------------------------------------------------------------


class AsyncStream:
    """A server stream (grpc.aio) whose failures are LedgerErrors: ``async for``; ``cancel()``."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._iterator = None

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self):
        if self._iterator is None:
            self._iterator = self._call.__aiter__()
        try:
            return await self._iterator.__anext__()
        except grpc.RpcError as rpc_error:
            raise error_from_rpc(rpc_error) from None

    def cancel(self) -> None:
        self._call.cancel()


def _async_method(stub: Any, method, settings: _CallSettings):
    callable_ = getattr(stub, method.name)
    name = method.name

    if method.server_streaming:

        def open_stream(request, *, timeout: float | None = None) -> AsyncStream:
            call = callable_(request, metadata=settings.metadata, timeout=timeout or settings.timeout_seconds)
            return AsyncStream(call)

        return open_stream

    async def call(request, *, timeout: float | None = None):
        retrying = _Retrying(name, request, settings.retry)
        while True:
            try:
                return await callable_(request, metadata=settings.metadata, timeout=timeout or settings.timeout_seconds)
            except grpc.RpcError as rpc_error:
                error = error_from_rpc(rpc_error)
            delay = None if method.client_streaming else retrying.delay_before_next(error)
            if delay is None:
                raise error
            await asyncio.sleep(delay)

    return call
