"""A thin Python client: stubs with the bearer token and a deadline on every call, and the
server's rich error details turned back into the service's own exception classes.

    from effect_ledger.client import LedgerClient
    client = LedgerClient("127.0.0.1:50051", token)
    run = client.runs.CreateRun(runs_pb2.CreateRunRequest())

Over TLS, name the CA that signed the server's certificate; with mTLS, the client's own
certificate and key as well (each as PEM bytes or a file path):

    client = LedgerClient("ledger.internal:50051", token, root_certificates="ca.pem",
                          client_certificate="agent.pem", client_key="agent-key.pem")
"""

from __future__ import annotations

import os
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from effect_ledger import errors
from effect_ledger.transport.status import ERROR_TABLE
from effectledger.v1 import (
    approvals_pb2_grpc,
    budgets_pb2_grpc,
    checkpoints_pb2_grpc,
    gate_pb2_grpc,
    principals_pb2_grpc,
    retention_pb2_grpc,
    runs_pb2_grpc,
    schedules_pb2_grpc,
    tools_pb2_grpc,
)

# PEM bytes, or the path of a PEM file.
Pem = bytes | str | os.PathLike
# A CA bundle, a certificate chain or a key is a few KiB; a larger file is not one of those.
PEM_FILE_SIZE_MAX_BYTES = 1024 * 1024

_CLASS_BY_CODE = {grpc_code: error_class for error_class, grpc_code, _ in reversed(ERROR_TABLE)}
_CLASS_BY_CODE[grpc.StatusCode.UNAVAILABLE] = errors.Unavailable


def error_from_rpc(error: grpc.RpcError) -> errors.LedgerError:
    """The LedgerError a failed call stands for, with reason, metadata and violations."""
    code = error.code()
    status = rpc_status.from_call(error)
    reason, metadata = code.name, {}
    field_violations: list[errors.FieldViolation] = []
    precondition_violations: list[errors.PreconditionViolation] = []
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                field_violations = [errors.FieldViolation(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
                failure = error_details_pb2.PreconditionFailure()
                detail.Unpack(failure)
                precondition_violations = [
                    errors.PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations
                ]
    message = error.details() or code.name
    error_class = _CLASS_BY_CODE.get(code)
    if error_class is errors.InvalidArgument:
        result: errors.LedgerError = errors.InvalidArgument(
            message, reason=reason, violations=field_violations, metadata=metadata
        )
    elif error_class is errors.FailedPrecondition:
        result = errors.FailedPrecondition(
            message, reason=reason, violations=precondition_violations, metadata=metadata
        )
    elif error_class is errors.NotFound:
        result = errors.NotFound(
            metadata.get("resource_type", "resource"), metadata.get("resource_name", ""), reason=reason
        )
        result.metadata.update(metadata)  # all of it (REMOVED_BY_RETENTION names its tombstone)
    elif error_class is errors.Unavailable and reason in ("POLICY_UNAVAILABLE", "POLICY_UNDEFINED"):
        result = errors.PolicyUnavailable(message, reason=reason, metadata=metadata)
    elif error_class is errors.Unavailable and reason == "STORAGE_UNAVAILABLE":
        result = errors.StorageUnavailable(message, reason=reason, metadata=metadata)
    elif error_class is not None:
        result = error_class(message, reason=reason, metadata=metadata)
    else:
        result = errors.LedgerError(message, reason=reason, metadata=metadata)
    result.grpc_code = code  # type: ignore[attr-defined]
    return result


class _Stub:
    """Wraps a generated stub: adds metadata and a deadline, raises LedgerError on failure."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...], timeout_seconds: float) -> None:
        self._stub = stub
        self._metadata = metadata
        self._timeout_seconds = timeout_seconds

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)

        def call(request, timeout: float | None = None):
            try:
                return method(request, metadata=self._metadata, timeout=timeout or self._timeout_seconds)
            except grpc.RpcError as error:
                raise error_from_rpc(error) from None

        return call


class LedgerClient:
    def __init__(
        self,
        target: str,
        token: str,
        *,
        timeout_seconds: float = 10.0,
        channel: grpc.Channel | None = None,
        root_certificates: Pem | None = None,
        client_certificate: Pem | None = None,
        client_key: Pem | None = None,
    ) -> None:
        """Plaintext unless a TLS option is given. ``root_certificates``: the CA that signed the
        server's certificate (without it, the system's default roots); ``client_certificate`` and
        ``client_key``: this client's certificate chain and key, for a server that requires
        client certificates (mTLS)."""
        credentials = channel_credentials(root_certificates, client_certificate, client_key)
        if channel is not None and credentials is not None:
            raise ValueError("give either a channel or TLS options, not both")
        if channel is not None:
            self.channel = channel
        elif credentials is not None:
            self.channel = grpc.secure_channel(target, credentials)
        else:
            self.channel = grpc.insecure_channel(target)
        metadata = (("authorization", f"Bearer {token}"),)
        self.tools = _Stub(tools_pb2_grpc.ToolRegistryStub(self.channel), metadata, timeout_seconds)
        self.runs = _Stub(runs_pb2_grpc.RunsStub(self.channel), metadata, timeout_seconds)
        self.gate = _Stub(gate_pb2_grpc.GateStub(self.channel), metadata, timeout_seconds)
        self.approvals = _Stub(approvals_pb2_grpc.ApprovalsStub(self.channel), metadata, timeout_seconds)
        self.budgets = _Stub(budgets_pb2_grpc.BudgetsStub(self.channel), metadata, timeout_seconds)
        self.checkpoints = _Stub(checkpoints_pb2_grpc.CheckpointsStub(self.channel), metadata, timeout_seconds)
        self.principals = _Stub(principals_pb2_grpc.PrincipalsStub(self.channel), metadata, timeout_seconds)
        self.schedules = _Stub(schedules_pb2_grpc.SchedulesStub(self.channel), metadata, timeout_seconds)
        self.retention = _Stub(retention_pb2_grpc.RetentionStub(self.channel), metadata, timeout_seconds)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def channel_credentials(
    root_certificates: Pem | None = None,
    client_certificate: Pem | None = None,
    client_key: Pem | None = None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials for a channel to the ledger; None when no option is given (plaintext)."""
    if (client_certificate is None) != (client_key is None):
        raise ValueError("client_certificate and client_key come together")
    if root_certificates is None and client_certificate is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(root_certificates),
        private_key=_pem(client_key),
        certificate_chain=_pem(client_certificate),
    )


def _pem(value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as file:
        data = file.read(PEM_FILE_SIZE_MAX_BYTES + 1)
    if len(data) > PEM_FILE_SIZE_MAX_BYTES:
        raise ValueError(f"{os.fspath(value)}: larger than {PEM_FILE_SIZE_MAX_BYTES} bytes, not a PEM file")
    return data
