"""The final gate: AuthorizeEffect (service/authorize.py), the reports about the attempts it
authorized and their reconciliation (service/attempts.py), leases (service/leases.py); the pure
rules are in domain/gate_rules.py.

Every method runs inside one unit of work (one database transaction): whatever it decides is
written together with the decision record and the trace events, or not at all.
"""

from __future__ import annotations

from effect_ledger.config import Limits
from effect_ledger.policy.engine import PolicyEngine
from effect_ledger.service.approvals import ApprovalSettings
from effect_ledger.service.attempts import AttemptReports
from effect_ledger.service.authorize import Authorizer


class Gate(Authorizer, AttemptReports):
    """The gate's use cases, sharing the policy engine, the limits and the settings."""

    def __init__(
        self,
        policy: PolicyEngine,
        limits: Limits,
        approval_settings: ApprovalSettings | None = None,
        reconcile_grace_seconds: float = -1.0,
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.approval_settings = approval_settings or ApprovalSettings()
        # Negative: each attempt's own lease length.
        self.reconcile_grace_seconds = reconcile_grace_seconds
