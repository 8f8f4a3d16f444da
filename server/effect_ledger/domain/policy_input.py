"""The policy input: built by the server from its own ledger, never from what a client says.

Client data appears only under ``request`` (the intent as asked: tool name, target, key and
arguments). Everything else (principal, run, contracts, the effect and its attempts, the run's
open effects, unknown effects on the target, the ledger's verdict, the time) is read from the
ledger in the same transaction as the decision. See docs/policy-input.md.
"""

from __future__ import annotations

from typing import Any

from effect_ledger.domain.lifecycle import LedgerVerdict, counted_attempts
from effect_ledger.domain.model import Effect, Principal, Run, ToolContract
from effect_ledger.domain.trace import timestamp_text

INPUT_VERSION = 1


def principal_fact(principal: Principal) -> dict[str, Any]:
    return {
        "id": principal.principal_id,
        "tenant": principal.tenant_id,
        "roles": sorted(role.value for role in principal.roles),
    }


def effect_fact(effect: Effect) -> dict[str, Any]:
    return {
        "effect_id": effect.effect_id,
        "run_id": effect.run_id,
        "stage": effect.stage.value,
        "tool_revision": effect.tool_revision,
        "attempt_count": counted_attempts(effect.attempts),
        "attempts": [
            {
                "number": attempt.number,
                "stage": attempt.stage.value,
                "provider_key_reused": attempt.provider_key_reused,
                "failure_evidence": attempt.failure_evidence.value if attempt.failure_evidence else None,
            }
            for attempt in effect.attempts
        ],
    }


def build_policy_input(
    *,
    now: Any,
    principal: Principal,
    run: Run,
    tool: str,
    target: str,
    idempotency_key: str,
    arguments: dict[str, Any],
    intent_digest: str,
    contract: ToolContract | None,
    pinned_contract: ToolContract | None,
    effect: Effect | None,
    verdict: LedgerVerdict,
    run_open_effects: list[dict[str, Any]],
    run_open_effects_limit: int,
    target_unknown_effects: list[dict[str, Any]],
    estimate: dict[str, int],
    requested_estimate: dict[str, int],
    budgets: list[dict[str, Any]],
    approvals: list[dict[str, Any]],
    pending_reconciliation: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "version": INPUT_VERSION,
        "now": timestamp_text(now),
        "principal": principal_fact(principal),
        "run": {
            "id": run.run_id,
            "created_by": run.created_by,
            "revision": run.revision,
            "labels": run.labels,
            "world": run.world,
            "segment": run.segment,
            "parent_run_id": run.parent_run_id,
            "pending_reconciliation": list(pending_reconciliation),
        },
        "request": {
            "tool": tool,
            "target": target,
            "idempotency_key": idempotency_key,
            "intent_digest": intent_digest,
            "arguments": arguments,
            "estimate": dict(sorted(requested_estimate.items())),
        },
        "contract": contract.as_policy_fact() if contract is not None else None,
        "pinned_contract": pinned_contract.as_policy_fact() if pinned_contract is not None else None,
        "effect": effect_fact(effect) if effect is not None else None,
        "ledger": {
            "verdict": verdict.kind.value,
            "creates_attempt": verdict.kind.creates_attempt,
            "reasons": [reason.as_json() for reason in verdict.reasons],
        },
        "run_open_effects": run_open_effects,
        "run_open_effects_truncated": len(run_open_effects) >= run_open_effects_limit,
        "target_unknown_effects": target_unknown_effects,
        "estimate": dict(sorted(estimate.items())),
        "budgets": budgets,
        "approvals": approvals,
    }


def build_reconcile_input(
    *,
    now: Any,
    principal: Principal,
    effect: Effect,
    contract: ToolContract,
    evidence_kind: str,
    reason: str,
    lookup_reference: str,
    has_lookup_result: bool,
    settled: list[Any],
    refusals: list[dict[str, str]],
) -> dict[str, Any]:
    """The input of ``data.effectledger.reconcile.decision`` (docs/policy-input.md,
    "ReconcileEffect"). Caller data is only under ``evidence`` (what it says the provider
    answered); ``by_owner`` and everything else come from the ledger."""
    owners = {attempt.principal_id for attempt in settled if attempt.principal_id}
    return {
        "version": INPUT_VERSION,
        "now": timestamp_text(now),
        "principal": principal_fact(principal),
        "effect": {
            "id": effect.effect_id,
            "run_id": effect.run_id,
            "tool": effect.tool,
            "tool_revision": effect.tool_revision,
            "stage": effect.stage.value,
            "idempotency_key": effect.idempotency_key,
        },
        "contract": contract.as_policy_fact(),
        "evidence": {
            "kind": evidence_kind,
            "reason": reason,
            "by_owner": principal.principal_id in owners,
            "lookup_reference": lookup_reference,
            "has_lookup_result": has_lookup_result,
        },
        "attempts": [
            {
                "attempt_id": attempt.attempt_id,
                "number": attempt.number,
                "stage": attempt.stage.value,
                "principal_id": attempt.principal_id,
                "lease_expires_at": timestamp_text(attempt.lease_expires_at),
            }
            for attempt in settled
        ],
        "ledger": {"refusals": refusals},
    }
