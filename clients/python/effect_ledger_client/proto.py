"""The generated messages and stubs of ``effectledger.v1``, under their usual module names.

from effect_ledger_client.proto import gate_pb2, runs_pb2
"""

from effect_ledger_client._proto.effectledger.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    budgets_pb2,
    budgets_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
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

__all__ = [
    "approvals_pb2",
    "approvals_pb2_grpc",
    "budgets_pb2",
    "budgets_pb2_grpc",
    "checkpoints_pb2",
    "checkpoints_pb2_grpc",
    "common_pb2",
    "gate_pb2",
    "gate_pb2_grpc",
    "principals_pb2",
    "principals_pb2_grpc",
    "retention_pb2",
    "retention_pb2_grpc",
    "runs_pb2",
    "runs_pb2_grpc",
    "schedules_pb2",
    "schedules_pb2_grpc",
    "tools_pb2",
    "tools_pb2_grpc",
]
