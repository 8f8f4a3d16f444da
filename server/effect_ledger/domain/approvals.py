"""Approvals bound to one exact intent.

An approval names tenant, run, tool, tool revision and intent digest. It counts at the gate only
while every binding fact matches, it is APPROVED by at least ``quorum`` distinct reviewers who
hold the reviewer or admin role *now* (and none of them requested the effect), it has not
expired by the database clock, and it was neither revoked nor used up. The service checks these
facts itself, whatever policy says, so a policy bug cannot widen an approval.

States: PENDING -> APPROVED | DENIED | REVOKED; APPROVED -> CONSUMED | REVOKED. EXPIRED is not
stored: it is read from ``expires_at`` against the database clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from effect_ledger.domain.model import Role

DECIDING_ROLES = frozenset({Role.REVIEWER, Role.ADMIN})
QUORUM_MAX = 10


class ApprovalState(enum.StrEnum):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    DENIED = "DENIED"
    REVOKED = "REVOKED"
    CONSUMED = "CONSUMED"
    EXPIRED = "EXPIRED"  # effective state only, never stored


@dataclass(frozen=True)
class Vote:
    reviewer_id: str
    approve: bool
    comment: str
    created_at: datetime


@dataclass
class Approval:
    approval_id: str
    run_id: str
    tool: str
    tool_revision: int
    target: str
    intent_digest: str
    arguments: dict[str, Any]
    requested_by: str
    state: ApprovalState
    reusable: bool
    quorum: int
    reason: str
    created_at: datetime
    expires_at: datetime
    updated_at: datetime
    votes: list[Vote] = field(default_factory=list)
    consumed_by_attempt: str = ""
    revoked_by: str = ""
    revoke_reason: str = ""

    def effective_state(self, now: datetime) -> ApprovalState:
        if self.state in (ApprovalState.PENDING, ApprovalState.APPROVED) and self.expires_at <= now:
            return ApprovalState.EXPIRED
        return self.state

    @property
    def denial(self) -> Vote | None:
        return next((vote for vote in self.votes if not vote.approve), None)


@dataclass(frozen=True)
class Intent:
    run_id: str
    tool: str
    tool_revision: int
    intent_digest: str


def valid_approvers(approval: Approval, reviewers_with_authority: frozenset[str], executor_id: str = "") -> list[str]:
    """Distinct approving reviewers who hold a deciding role now and are neither the principal
    that requested the effect nor ``executor_id``, the principal that would execute it."""
    return sorted(
        {
            vote.reviewer_id
            for vote in approval.votes
            if vote.approve
            and vote.reviewer_id in reviewers_with_authority
            and vote.reviewer_id not in (approval.requested_by, executor_id)
        }
    )


def binding_problems(
    approval: Approval,
    intent: Intent,
    now: datetime,
    reviewers_with_authority: frozenset[str],
    executor_id: str,
) -> list[str]:
    """Why this approval does not authorize this intent, executed by ``executor_id``, now (empty:
    it does). Four eyes: an approval by the executor never counts for it."""
    problems = []
    if (approval.run_id, approval.tool, approval.tool_revision, approval.intent_digest) != (
        intent.run_id,
        intent.tool,
        intent.tool_revision,
        intent.intent_digest,
    ):
        problems.append("APPROVAL_NOT_BOUND_TO_INTENT")
    state = approval.effective_state(now)
    if state == ApprovalState.CONSUMED:
        # Used up, reusable or not: a reusable approval that policy let stay usable is never
        # consumed (it stays APPROVED), so a CONSUMED one was single-use for this policy.
        problems.append("APPROVAL_USED")
    elif state != ApprovalState.APPROVED:
        problems.append(f"APPROVAL_{state.value}")
    if any(vote.approve and vote.reviewer_id == executor_id for vote in approval.votes):
        problems.append("APPROVED_BY_EXECUTOR")
    if len(valid_approvers(approval, reviewers_with_authority, executor_id)) < approval.quorum:
        problems.append("APPROVAL_QUORUM_NOT_MET")
    return problems


def state_after_vote(approval: Approval, reviewers_with_authority: frozenset[str]) -> ApprovalState:
    """PENDING until a denial (DENIED) or a quorum of valid approvals (APPROVED)."""
    if approval.denial is not None:
        return ApprovalState.DENIED
    if len(valid_approvers(approval, reviewers_with_authority)) >= approval.quorum:
        return ApprovalState.APPROVED
    return ApprovalState.PENDING


def approval_fact(
    approval: Approval, now: datetime, reviewers_with_authority: frozenset[str], intent: Intent, executor_id: str
) -> dict[str, Any]:
    """What policy sees of an approval for the intent being decided, for ``executor_id``."""
    denial = approval.denial
    return {
        "approval_id": approval.approval_id,
        "state": approval.effective_state(now).value,
        "reusable": approval.reusable,
        "quorum": approval.quorum,
        "valid_approvers": valid_approvers(approval, reviewers_with_authority, executor_id),
        "denied_by": denial.reviewer_id if denial else None,
        "requested_by": approval.requested_by,
        "binding_problems": binding_problems(approval, intent, now, reviewers_with_authority, executor_id),
    }
