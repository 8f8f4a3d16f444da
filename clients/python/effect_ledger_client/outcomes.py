"""What the guard answers besides running the body, and the values it hands back.

GuardError                  the gate did not allow the effect; the body did not run
├── Denied                  DENY: .reasons, .decision_id
│   └── ApprovalDenied      a reviewer denied the approval: .approval_id
├── ApprovalTimeout         no decision in time: .approval_id
├── ReconcileRequired       an earlier attempt may have happened: .effect_id, .stage
└── AlreadySucceeded        DUPLICATE in the ``with`` form: .receipt, .effect_id
Rejected                    raised by the body: the provider definitely refused (FAILED)
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reason:
    code: str
    message: str


@dataclass(frozen=True)
class Receipt:
    """Evidence that the effect happened: the provider's reference and what else it returned."""

    reference: str
    detail: dict[str, Any] | None = None
    # SHA-256 (hex) the ledger computed over reference and detail.
    digest: str = ""
    recorded_at: datetime.datetime | None = None

    @classmethod
    def from_proto(cls, receipt) -> Receipt:
        detail = json.loads(receipt.detail_json) if receipt.detail_json else None
        recorded_at = receipt.recorded_at.ToDatetime(tzinfo=datetime.UTC) if receipt.HasField("recorded_at") else None
        return cls(receipt.provider_reference, detail, receipt.digest, recorded_at)


def reasons_of(response) -> list[Reason]:
    return [Reason(reason.code, reason.message) for reason in response.reasons]


class GuardError(Exception):
    """The gate did not allow the effect: the guarded body did not run."""


class Denied(GuardError):
    def __init__(self, reasons: list[Reason], decision_id: str, message: str = "") -> None:
        codes = ", ".join(reason.code for reason in reasons) or "no reason given"
        super().__init__(message or f"denied: {codes}")
        self.reasons = reasons
        self.decision_id = decision_id


class ApprovalDenied(Denied):
    def __init__(self, approval_id: str, reasons: list[Reason], decision_id: str) -> None:
        super().__init__(reasons, decision_id, f"approval {approval_id} was denied")
        self.approval_id = approval_id


class ApprovalTimeout(GuardError):
    def __init__(self, approval_id: str, timeout_seconds: float) -> None:
        super().__init__(f"approval {approval_id} was not decided within {timeout_seconds} s")
        self.approval_id = approval_id
        self.timeout_seconds = timeout_seconds


class ReconcileRequired(GuardError):
    """An earlier attempt of this effect is open or its outcome is unknown: it may have happened.
    Settle it (``ReconcileEffect`` with a receipt, or "not happened" with evidence) first."""

    def __init__(self, effect_id: str, stage: str, reasons: list[Reason], decision_id: str) -> None:
        super().__init__(f"effect {effect_id} is {stage}: reconcile it before anything else")
        self.effect_id = effect_id
        self.stage = stage
        self.reasons = reasons
        self.decision_id = decision_id


class AlreadySucceeded(GuardError):
    """DUPLICATE: the effect already succeeded. Raised from ``__enter__`` of the ``with`` form,
    the only way a context manager can skip its body; the decorator returns ``receipt`` instead."""

    def __init__(self, receipt: Receipt, effect_id: str) -> None:
        super().__init__(f"effect {effect_id} already succeeded: {receipt.reference}")
        self.receipt = receipt
        self.effect_id = effect_id


class Rejected(Exception):
    """Raised by a guarded body when the provider answered that it did not apply the effect:
    recorded as FAILED (evidence PROVIDER_REJECTED), then re-raised. Anything else is UNKNOWN."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
