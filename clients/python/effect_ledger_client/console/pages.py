"""The console's pages: each reads what it shows from the gate with the session's token."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from effect_ledger_client.console import chain
from effect_ledger_client.console.sessions import Session
from effect_ledger_client.console.web import Console, field_text, refusal_text
from effect_ledger_client.errors import LedgerError
from effect_ledger_client.proto import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    runs_pb2,
)

# Pages read at most this many pages of a list before they stop and say so.
PAGES_PER_LIST_MAX = 10
EVENTS_PER_RUN_MAX = 10_000
INBOX_SIZE_MAX = 100
OPEN_STAGES = (common_pb2.UNKNOWN, common_pb2.AUTHORIZED, common_pb2.DISPATCHED)
REASON_LENGTH_MAX = 2000
# The trace events a fork writes: run.forked in the new run, run.fork_created in its parent.
FORK_EVENTS = ("run.forked", "run.fork_created")


async def collect(call: Callable[[Any], Awaitable[Any]], request: Any, items: str) -> tuple[list, bool]:
    """Every item of a paged list (at most PAGES_PER_LIST_MAX pages); True when it was all."""
    found: list = []
    for _ in range(PAGES_PER_LIST_MAX):
        response = await call(request)
        found.extend(getattr(response, items))
        if not response.next_page_token:
            return found, True
        request.page_token = response.next_page_token
    return found, False


def _redirect(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


# --- approvals --------------------------------------------------------------------------------


async def _policy_decision(ledger, approval) -> Any:
    """The REQUIRE_APPROVAL decision that asked for this approval (the newest for its intent)."""
    decisions, _ = await collect(
        ledger.gate.ListDecisions,
        gate_pb2.ListDecisionsRequest(
            run_id=approval.run_id, tool=approval.tool, outcome=common_pb2.REQUIRE_APPROVAL, page_size=500
        ),
        "decisions",
    )
    matching = [d for d in decisions if d.intent_digest == approval.intent_digest]
    return matching[-1] if matching else None


async def inbox_items(session: Session) -> list[dict[str, Any]]:
    ledger = session.ledger
    response = await ledger.approvals.ListApprovals(
        approvals_pb2.ListApprovalsRequest(state=approvals_pb2.PENDING, page_size=INBOX_SIZE_MAX)
    )
    decisions = await asyncio.gather(*(_policy_decision(ledger, a) for a in response.approvals))
    return [{"approval": a, "decision": d} for a, d in zip(response.approvals, decisions, strict=True)]


def inbox_version(items: list[dict[str, Any]]) -> str:
    """Names what the inbox shows: the page swaps in a fresh list only when it changed."""
    parts = [f"{i['approval'].approval_id}:{i['approval'].updated_at.ToJsonString()}" for i in items]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


async def approvals_page(console: Console, request: Request, session: Session) -> Response:
    items = await inbox_items(session)
    return console.render(request, "approvals.html", session, items=items, version=inbox_version(items))


async def approvals_fragment(console: Console, request: Request, session: Session) -> Response:
    items = await inbox_items(session)
    return console.render(request, "_inbox.html", session, fragment=True, items=items, version=inbox_version(items))


async def approval_page(console: Console, request: Request, session: Session) -> Response:
    approval = await session.ledger.approvals.GetApproval(
        approvals_pb2.GetApprovalRequest(approval_id=request.path_params["approval_id"])
    )
    decision = await _policy_decision(session.ledger, approval)
    return console.render(request, "approval.html", session, item={"approval": approval, "decision": decision})


async def decide_approval(console: Console, request: Request, session: Session, form: FormData) -> Response:
    approval_id = request.path_params["approval_id"]
    verdict = field_text(form, "verdict")
    comment = field_text(form, "comment")[:REASON_LENGTH_MAX]
    if verdict not in ("approve", "deny"):
        session.flash("error", "Choose approve or deny.")
        return _redirect(f"/approvals/{approval_id}")
    if not comment:
        session.flash("error", "A reason is required to approve or deny.")
        return _redirect(f"/approvals/{approval_id}")
    try:
        approval = await session.ledger.approvals.DecideApproval(
            approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=verdict == "approve", comment=comment)
        )
    except LedgerError as error:
        session.flash("error", f"The gate refused to {verdict} {approval_id}: {refusal_text(error)}")
        return _redirect(f"/approvals/{approval_id}")
    state = approvals_pb2.ApprovalState.Name(approval.state)
    session.flash("ok", f"Recorded: {verdict} on {approval_id} ({approval.tool}); the request is now {state}.")
    return _redirect("/approvals")


# --- runs -------------------------------------------------------------------------------------


async def runs_page(console: Console, request: Request, session: Session) -> Response:
    page_token = request.query_params.get("page_token", "")[:512]
    response = await session.ledger.runs.ListRuns(runs_pb2.ListRunsRequest(page_size=100, page_token=page_token))
    return console.render(request, "runs.html", session, runs=response.runs, next_page_token=response.next_page_token)


async def _run_events(ledger, run_id: str) -> tuple[list, bool]:
    events: list = []
    after = 0
    while len(events) < EVENTS_PER_RUN_MAX:
        response = await ledger.runs.ListRunEvents(
            runs_pb2.ListRunEventsRequest(run_id=run_id, after_revision=after, page_size=1000)
        )
        events.extend(response.events)
        if not response.next_after_revision:
            return events, True
        after = response.next_after_revision
    return events, False


async def _tenant_of(ledger, decisions: list) -> str | None:
    """The tenant id, read from the policy input of one of the run's decisions."""
    if not decisions:
        return None
    decision = await ledger.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decisions[0].decision_id))
    try:
        tenant = json.loads(decision.input_json)["principal"]["tenant"]
    except (ValueError, KeyError, TypeError):
        return None
    return tenant if isinstance(tenant, str) else None


def _verdict(run, events: list, complete: bool, tenant_id: str | None) -> chain.ChainVerdict:
    chain_events = [
        chain.ChainEvent(
            revision=e.revision,
            type=e.type,
            payload_json=e.payload_json,
            principal_id=e.principal_id,
            created_at=e.created_at.ToDatetime(tzinfo=UTC),
            prev_hash=e.prev_hash,
            hash=e.hash,
            removed_tombstone_id=e.removed_by_retention.tombstone_id,
        )
        for e in events
    ]
    return chain.verify_chain(
        chain_events,
        run_id=run.run_id,
        head_revision=run.revision,
        head_hash=run.head_hash,
        tenant_id=tenant_id,
        complete=complete,
    )


def _fork(event) -> dict[str, Any]:
    try:
        payload = json.loads(event.payload_json)
    except ValueError:
        payload = {}
    return {"event": event, "payload": payload if isinstance(payload, dict) else {}}


async def run_page(console: Console, request: Request, session: Session) -> Response:
    ledger, run_id = session.ledger, request.path_params["run_id"]
    run = await ledger.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    (events, complete), (effects, _), (decisions, _), (checkpoints, _) = await asyncio.gather(
        _run_events(ledger, run_id),
        collect(ledger.gate.ListEffects, gate_pb2.ListEffectsRequest(run_id=run_id, page_size=500), "effects"),
        collect(ledger.gate.ListDecisions, gate_pb2.ListDecisionsRequest(run_id=run_id, page_size=500), "decisions"),
        collect(
            ledger.checkpoints.ListCheckpoints,
            checkpoints_pb2.ListCheckpointsRequest(run_id=run_id, page_size=500),
            "checkpoints",
        ),
    )
    verdict = _verdict(run, events, complete, await _tenant_of(ledger, decisions))
    forks = [_fork(e) for e in events if e.type in FORK_EVENTS]
    return console.render(
        request,
        "run.html",
        session,
        run=run,
        events=events,
        effects=effects,
        decisions=decisions,
        checkpoints=checkpoints,
        verdict=verdict,
        forks=forks,
    )


# --- effects ----------------------------------------------------------------------------------


async def effects_page(console: Console, request: Request, session: Session) -> Response:
    effects, complete = await collect(
        session.ledger.gate.ListEffects, gate_pb2.ListEffectsRequest(stages=OPEN_STAGES, page_size=500), "effects"
    )
    unknown_first = sorted(effects, key=lambda effect: effect.stage != common_pb2.UNKNOWN)
    return console.render(request, "effects.html", session, effects=unknown_first, complete=complete)


def _reconcile_request(effect_id: str, form: FormData) -> gate_pb2.ReconcileEffectRequest | str:
    """The request the form asks for, or what is wrong with the form."""
    evidence = field_text(form, "evidence")
    if evidence == "receipt":
        reference = field_text(form, "provider_reference")
        detail = field_text(form, "detail_json") or "{}"
        if not reference:
            return "A receipt needs the provider's reference."
        if not _is_json_object(detail):
            return "The receipt's detail must be a JSON object."
        receipt = common_pb2.Receipt(provider_reference=reference, detail_json=detail.encode())
        return gate_pb2.ReconcileEffectRequest(effect_id=effect_id, receipt=receipt)
    if evidence == "not_happened":
        reason = field_text(form, "reason")[:REASON_LENGTH_MAX]
        lookup_result = field_text(form, "lookup_result_json")
        if not reason:
            return "Say what the provider answered, and how it was asked."
        if lookup_result and not _is_json_object(lookup_result):
            return "The lookup's answer must be a JSON object."
        not_happened = gate_pb2.ReconcileEffectRequest.NotHappened(
            reason=reason,
            lookup_reference=field_text(form, "lookup_reference"),
            lookup_result_json=lookup_result.encode(),
        )
        return gate_pb2.ReconcileEffectRequest(effect_id=effect_id, not_happened=not_happened)
    return "Choose the evidence: a receipt, or that it did not happen."


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def reconcile_effect(console: Console, request: Request, session: Session, form: FormData) -> Response:
    effect_id = request.path_params["effect_id"]
    built = _reconcile_request(effect_id, form)
    if isinstance(built, str):
        session.flash("error", f"{effect_id}: {built}")
        return _redirect("/effects")
    try:
        effect = await session.ledger.gate.ReconcileEffect(built)
    except LedgerError as error:
        session.flash("error", f"The gate refused to reconcile {effect_id}: {refusal_text(error)}")
        return _redirect("/effects")
    stage = common_pb2.Stage.Name(effect.stage)
    session.flash("ok", f"Reconciled {effect_id} ({effect.tool}); it is now {stage}.")
    return _redirect("/effects")


# --- budgets and decisions --------------------------------------------------------------------


async def budgets_page(console: Console, request: Request, session: Session) -> Response:
    budgets, complete = await collect(
        session.ledger.budgets.ListBudgets, budgets_pb2.ListBudgetsRequest(page_size=500), "budgets"
    )
    return console.render(request, "budgets.html", session, budgets=budgets, complete=complete)


async def decision_page(console: Console, request: Request, session: Session) -> Response:
    decision_id = request.path_params["decision_id"]
    decision = await session.ledger.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id))
    replay, replay_error = None, None
    if request.query_params.get("replay") == "1":
        try:
            replay = await session.ledger.gate.ReplayDecision(gate_pb2.ReplayDecisionRequest(decision_id=decision_id))
        except LedgerError as error:
            replay_error = refusal_text(error)
    return console.render(
        request, "decision.html", session, decision=decision, replay=replay, replay_error=replay_error
    )
