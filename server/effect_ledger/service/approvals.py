"""Approvals: requests bound to one exact intent, reviewers' decisions, revocation, the feed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from effect_ledger.domain import approvals as rules
from effect_ledger.domain.approvals import Approval, ApprovalState, Intent, Vote
from effect_ledger.domain.canonical import intent_digest, parse_json
from effect_ledger.domain.contracts import (
    check_identifier,
    check_target,
    check_text,
    check_tool_name,
)
from effect_ledger.domain.model import Principal
from effect_ledger.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
)
from effect_ledger.service import quotas
from effect_ledger.storage import approval_store as store
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork


@dataclass(frozen=True)
class ApprovalSettings:
    ttl_seconds_default: int = 3600
    ttl_seconds_max: int = 7 * 86_400
    arguments_size_max_bytes: int = 64 * 1024
    # A tenant's open requests (PENDING, not expired) at once: a quota, checked before a new
    # request is filed (concurrent requests may pass it by their number).
    open_requests_per_tenant_max: int = 10_000


@dataclass(frozen=True)
class ApprovalRequest:
    run_id: str
    tool: str
    arguments_json: bytes
    target: str
    reason: str
    reusable: bool
    ttl_seconds: int


def _ttl(requested: int, settings: ApprovalSettings) -> int:
    if requested < 0 or requested > settings.ttl_seconds_max:
        raise InvalidArgument.field(
            "ttl_seconds", f"must be between 0 and {settings.ttl_seconds_max}", reason="INVALID_TTL"
        )
    return requested or settings.ttl_seconds_default


async def _record(unit: UnitOfWork, tenant_id: str, approval: Approval, event_type: str, principal_id: str) -> None:
    await store.append_event(unit.connection, tenant_id, approval, event_type, principal_id, unit.now)
    unit.record_event(
        tenant_id,
        approval.run_id,
        event_type,
        {
            "approval_id": approval.approval_id,
            "intent_digest": approval.intent_digest,
            "state": approval.state.value,
            "tool": approval.tool,
            "tool_revision": approval.tool_revision,
        },
        principal_id,
    )


async def ensure_request(
    unit: UnitOfWork,
    principal: Principal,
    intent: Intent,
    target: str,
    arguments: dict[str, Any],
    *,
    quorum: int,
    reusable: bool,
    reason: str,
    ttl_seconds: int,
    open_max: int,
) -> Approval:
    """The open request for this intent, or a new one. An open request (PENDING, or APPROVED by
    fewer reviewers than policy now asks for) is returned, its quorum raised to policy's."""
    tenant = principal.tenant_id
    quorum = max(1, min(quorum, rules.QUORUM_MAX))
    await store.lock_intent(unit.connection, tenant, intent.run_id, intent.intent_digest)
    for approval in reversed(
        await store.for_intent(unit.connection, tenant, intent.run_id, intent.intent_digest, lock=True)
    ):
        state = approval.effective_state(unit.now)
        if approval.tool_revision != intent.tool_revision or state not in (
            ApprovalState.PENDING,
            ApprovalState.APPROVED,
        ):
            continue
        if approval.quorum < quorum:
            approval.quorum = quorum
            approval.state = ApprovalState.PENDING
            approval.updated_at = unit.now
            await store.save_state(unit.connection, tenant, approval)
            await _record(unit, tenant, approval, "approval.quorum_raised", principal.principal_id)
        elif state == ApprovalState.APPROVED:
            continue  # an approved request that policy found wanting for another reason
        return approval
    if await store.open_requests(unit.connection, tenant, unit.now, open_max) >= open_max:
        raise quotas.exceeded("open_approval_requests", tenant, open_max, "decide, revoke or let some expire")
    approval = Approval(
        approval_id=repo.new_id("apr"),
        run_id=intent.run_id,
        tool=intent.tool,
        tool_revision=intent.tool_revision,
        target=target,
        intent_digest=intent.intent_digest,
        arguments=arguments,
        requested_by=principal.principal_id,
        state=ApprovalState.PENDING,
        reusable=reusable,
        quorum=quorum,
        reason=reason,
        created_at=unit.now,
        expires_at=unit.now + timedelta(seconds=ttl_seconds),
        updated_at=unit.now,
    )
    await store.insert_approval(unit.connection, tenant, approval)
    await _record(unit, tenant, approval, "approval.requested", principal.principal_id)
    return approval


async def request_approval(
    unit: UnitOfWork, principal: Principal, request: ApprovalRequest, settings: ApprovalSettings
) -> Approval:
    check_identifier(request.run_id, "run_id")
    check_tool_name(request.tool)
    check_target(request.target)
    check_text(request.reason, "reason", required=False, lines=True)
    arguments = parse_json(
        request.arguments_json, field="arguments_json", size_max_bytes=settings.arguments_size_max_bytes
    )
    ttl = _ttl(request.ttl_seconds, settings)
    if await repo.get_run(unit.connection, principal.tenant_id, request.run_id) is None:
        raise NotFound("run", request.run_id)
    contract = await repo.latest_contract(unit.connection, principal.tenant_id, request.tool)
    if contract is None or contract.retired:
        reason = "TOOL_UNKNOWN" if contract is None else "TOOL_RETIRED"
        raise FailedPrecondition(
            f"tool {request.tool!r} cannot be approved: {reason}",
            reason=reason,
            violations=[PreconditionViolation(reason, f"tool/{request.tool}", "no live contract")],
        )
    digest = intent_digest(
        tool=request.tool, tool_revision=contract.revision, target=request.target, arguments=arguments
    )
    intent = Intent(request.run_id, request.tool, contract.revision, digest)
    return await ensure_request(
        unit,
        principal,
        intent,
        request.target,
        arguments,
        quorum=1,
        reusable=request.reusable,
        reason=request.reason,
        ttl_seconds=ttl,
        open_max=settings.open_requests_per_tenant_max,
    )


async def _locked(unit: UnitOfWork, principal: Principal, approval_id: str) -> Approval:
    check_identifier(approval_id, "approval_id")
    approval = await store.get(unit.connection, principal.tenant_id, approval_id, lock=True)
    if approval is None:
        raise NotFound("approval", approval_id)
    return approval


def _not_decidable(approval: Approval, state: ApprovalState) -> FailedPrecondition:
    return FailedPrecondition(
        f"approval {approval.approval_id} is {state.value}",
        reason="APPROVAL_EXPIRED" if state == ApprovalState.EXPIRED else "APPROVAL_NOT_PENDING",
        violations=[
            PreconditionViolation(f"APPROVAL_{state.value}", f"approval/{approval.approval_id}", f"state {state.value}")
        ],
        metadata={"state": state.value},
    )


async def decide(unit: UnitOfWork, principal: Principal, approval_id: str, approve: bool, comment: str) -> Approval:
    """A reviewer's vote, checked under current facts: role now, never the requester."""
    check_text(comment, "comment", required=not approve, lines=True)
    approval = await _locked(unit, principal, approval_id)
    if principal.principal_id == approval.requested_by:
        raise PermissionDenied("the principal that requested the effect cannot decide on it", reason="SELF_APPROVAL")
    state = approval.effective_state(unit.now)
    if state != ApprovalState.PENDING:
        raise _not_decidable(approval, state)
    if any(vote.reviewer_id == principal.principal_id for vote in approval.votes):
        raise FailedPrecondition("this reviewer already decided", reason="ALREADY_DECIDED")
    vote = Vote(principal.principal_id, approve, comment, unit.now)
    await store.insert_vote(unit.connection, principal.tenant_id, approval.approval_id, vote)
    approval.votes.append(vote)
    authority = await store.reviewers_with_authority(
        unit.connection, principal.tenant_id, {v.reviewer_id for v in approval.votes}
    )
    approval.state = rules.state_after_vote(approval, authority)
    approval.updated_at = unit.now
    await store.save_state(unit.connection, principal.tenant_id, approval)
    event = {ApprovalState.APPROVED: "approval.approved", ApprovalState.DENIED: "approval.denied"}.get(
        approval.state, "approval.voted"
    )
    await _record(unit, principal.tenant_id, approval, event, principal.principal_id)
    return approval


async def revoke(unit: UnitOfWork, principal: Principal, approval_id: str, reason: str) -> Approval:
    check_text(reason, "reason", required=True, lines=True)
    approval = await _locked(unit, principal, approval_id)
    deciding = principal.has_any(frozenset(rules.DECIDING_ROLES))
    if not deciding and principal.principal_id != approval.requested_by:
        raise PermissionDenied("only a reviewer, an admin or the requester can revoke", reason="ROLE_REQUIRED")
    state = approval.effective_state(unit.now)
    if state == ApprovalState.REVOKED:
        return approval
    if state not in (ApprovalState.PENDING, ApprovalState.APPROVED) and not (
        state == ApprovalState.CONSUMED and approval.reusable
    ):
        raise _not_decidable(approval, state)
    approval.state = ApprovalState.REVOKED
    approval.revoked_by = principal.principal_id
    approval.revoke_reason = reason
    approval.updated_at = unit.now
    await store.save_state(unit.connection, principal.tenant_id, approval)
    await _record(unit, principal.tenant_id, approval, "approval.revoked", principal.principal_id)
    return approval


async def get(unit: UnitOfWork, principal: Principal, approval_id: str) -> Approval:
    check_identifier(approval_id, "approval_id")
    approval = await store.get(unit.connection, principal.tenant_id, approval_id, lock=False)
    if approval is None:
        raise NotFound("approval", approval_id)
    return approval


def _check_filters(run_id: str, tool: str) -> None:
    if run_id:
        check_identifier(run_id, "run_id")
    if tool:
        check_tool_name(tool)


async def list_approvals(
    unit: UnitOfWork, principal: Principal, *, run_id: str, state: str, tool: str, after_id: str, limit: int
) -> list[Approval]:
    """Filtered by run, tool and effective state (EXPIRED is read from the clock)."""
    _check_filters(run_id, tool)
    stored_state = "" if state in ("", ApprovalState.EXPIRED.value) else state
    found: list[Approval] = []
    cursor = after_id
    while len(found) < limit:
        page = await store.listed(
            unit.connection,
            principal.tenant_id,
            run_id=run_id,
            state=stored_state,
            tool=tool,
            after_id=cursor,
            limit=limit,
        )
        if not page:
            break
        found.extend(a for a in page if not state or a.effective_state(unit.now).value == state)
        cursor = page[-1].approval_id
    return found[:limit]


@dataclass(frozen=True)
class FeedEvent:
    """One entry of the tenant's approval feed, with the approval as it is now."""

    sequence: int
    type: str
    approval: Approval
    principal_id: str
    created_at: datetime


async def latest_sequence(unit: UnitOfWork, principal: Principal) -> int:
    """The caller's tenant's last approval event sequence (0 before its first): where a watch
    "from now" starts."""
    return (await store.latest_sequences(unit.connection, [principal.tenant_id])).get(principal.tenant_id, 0)


async def feed_after(
    unit: UnitOfWork, principal: Principal, after_sequence: int, *, run_id: str, tool: str, limit: int
) -> list[FeedEvent]:
    """The caller's tenant's approval events after the cursor, in sequence order, filtered."""
    _check_filters(run_id, tool)
    rows = await store.events_after(unit.connection, principal.tenant_id, after_sequence, run_id, tool, limit)
    approvals: dict[str, Approval] = {}
    events = []
    for row in rows:
        approval = approvals.get(row.approval_id)
        if approval is None:
            approval = await store.get(unit.connection, principal.tenant_id, row.approval_id, lock=False)
            assert approval is not None, "an approval event names an approval of its tenant"
            approvals[row.approval_id] = approval
        events.append(FeedEvent(row.sequence, row.type, approval, row.principal_id, row.created_at))
    return events


async def usable_approval(
    unit: UnitOfWork, principal: Principal, approval_id: str, intent: Intent
) -> tuple[Approval | None, list[str]]:
    """The approval policy relied on, re-checked by the service under lock: (approval, problems)."""
    approval = await store.get(unit.connection, principal.tenant_id, approval_id, lock=True)
    if approval is None:
        return None, ["APPROVAL_NOT_FOUND"]
    authority = await store.reviewers_with_authority(
        unit.connection, principal.tenant_id, {v.reviewer_id for v in approval.votes}
    )
    return approval, rules.binding_problems(approval, intent, unit.now, authority, principal.principal_id)


async def consume(unit: UnitOfWork, principal: Principal, approval: Approval, attempt_id: str) -> None:
    if not await store.consume(unit.connection, principal.tenant_id, approval.approval_id, attempt_id, unit.now):
        raise Conflict("the approval was used concurrently")
    consumed = replace(approval, state=ApprovalState.CONSUMED, consumed_by_attempt=attempt_id, updated_at=unit.now)
    await _record(unit, principal.tenant_id, consumed, "approval.consumed", principal.principal_id)


async def facts_for_intent(unit: UnitOfWork, principal: Principal, intent: Intent) -> list[dict[str, Any]]:
    found = await store.for_intent(
        unit.connection, principal.tenant_id, intent.run_id, intent.intent_digest, lock=False
    )
    voters = {vote.reviewer_id for approval in found for vote in approval.votes}
    authority = await store.reviewers_with_authority(unit.connection, principal.tenant_id, voters)
    return [rules.approval_fact(approval, unit.now, authority, intent, principal.principal_id) for approval in found]
