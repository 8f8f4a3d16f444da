"""The console in headless Chromium against a real server: each page screenshotted and checked
with axe-core; approvals decided, effects reconciled, tenants kept apart."""

from __future__ import annotations

import json
import re
from datetime import UTC

from client.conftest import IRREVERSIBLE_TOOL, register, register_irreversible

from effect_ledger_client.proto import budgets_pb2, checkpoints_pb2, common_pb2, gate_pb2, runs_pb2
from support import authorize_request, unknown

WAIT_MS = 15_000


def test_a_reviewer_approves_a_request_and_the_agent_is_allowed(browsing, ledgers, tenant):
    agent, admin = ledgers["agent"], ledgers["admin"]
    register_irreversible(admin)
    admin.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(
            scope=budgets_pb2.TENANT, dimension="usd_micros", limit=1_000_000, reset_period_seconds=86_400
        )
    )
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest(labels={"ticket": "4711"})).run_id
    wire = authorize_request(
        run_id,
        "wire-1",
        tool=IRREVERSIBLE_TOOL,
        target="iban:DE02120300000000202051",
        arguments=b'{"amount_cents":125000,"to":"DE02120300000000202051"}',
    )
    wire.estimate["usd_micros"] = 250_000

    reviewer = browsing()
    reviewer.open("/sign-in")
    reviewer.visit("sign-in")
    reviewer.sign_in(tenant.tokens["reviewer"])
    page = reviewer.page
    assert page.get_by_text("No approval request is waiting").is_visible()
    page.wait_for_selector("#inbox[data-live=true]", timeout=WAIT_MS)

    first = agent.gate.AuthorizeEffect(wire)
    assert first.outcome == common_pb2.REQUIRE_APPROVAL
    # The request arrives through the approval feed, without a reload.
    card = page.locator(f'[data-approval-id="{first.approval_request_id}"]')
    card.wait_for(timeout=WAIT_MS)
    text = card.inner_text()
    for expected in (
        IRREVERSIBLE_TOOL,
        "iban:DE02120300000000202051",
        first.intent_digest,
        "agent",
        run_id,
        '{"amount_cents":125000,"to":"DE02120300000000202051"}',
        "REQUIRE_APPROVAL",
    ):
        assert expected in text, f"{expected!r} not in the inbox card"
    reviewer.visit("approvals")

    # No reason, no decision: the browser asks for one before anything is sent.
    card.get_by_role("button", name="Approve").click()
    assert agent.gate.AuthorizeEffect(wire).outcome == common_pb2.REQUIRE_APPROVAL
    card.get_by_label("Reason (required)").fill("Invoice 4711 checked against the contract")
    card.get_by_role("button", name="Approve").click()
    page.wait_for_url("**/approvals")
    assert "Recorded: approve" in page.locator(".flash-ok").inner_text()
    assert page.get_by_text("No approval request is waiting").is_visible()

    allowed = agent.gate.AuthorizeEffect(wire)
    assert allowed.outcome == common_pb2.ALLOW
    assert allowed.approval_id == first.approval_request_id
    # A checkpoint of the run and a fork of it, for the run's timeline.
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = agent.checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(run_id=run_id, expected_revision=revision, state_json=b'{"step":2}')
    )
    agent.checkpoints.RegisterCheckpoint(checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    fork = agent.checkpoints.ForkRun(
        checkpoints_pb2.ForkRunRequest(
            checkpoint_id=sealed.checkpoint_id, world=checkpoints_pb2.SIMULATED, difference="a smaller wire"
        )
    )

    reviewer.open(f"/approvals/{first.approval_request_id}")
    assert "CONSUMED" in page.locator("h1 + p").inner_text()
    reviewer.visit("approval")

    reviewer.open("/runs")
    assert page.get_by_role("row", name=run_id).first.get_by_role("link", name=run_id).is_visible()
    fork_row = page.get_by_role("row", name=fork.run_id)
    assert fork_row.get_by_role("link", name=run_id).is_visible()  # forked from
    reviewer.visit("runs")

    reviewer.open(f"/runs/{run_id}")
    assert page.locator(".chain .badge").inner_text() == "verified"
    assert page.locator("table.trace tbody tr").count() >= 3
    # The attempt with its lease, as the gate has it.
    (attempt,) = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id)).attempts
    lease = attempt.lease_expires_at.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    attempt_row = page.locator("article", has=page.locator(f"#effect-{allowed.effect_id}")).locator("tbody tr")
    assert attempt_row.locator("td").nth(3).inner_text() == lease
    # The decisions with their reason codes, as the gate recorded them (the ALLOW may have none).
    decisions = page.locator("table", has=page.locator("caption", has_text="Every answer of the gate"))
    recorded = {
        decision_id: ledgers["auditor"].gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id)).reasons
        for decision_id in (first.decision_id, allowed.decision_id)
    }
    assert recorded[first.decision_id], "the REQUIRE_APPROVAL has its reasons"
    for decision_id, reasons in recorded.items():
        row = decisions.locator("tr", has=page.get_by_role("link", name=decision_id, exact=True))
        assert row.locator("td").nth(4).locator("code").all_inner_texts() == [r.code for r in reasons], decision_id
    assert sealed.checkpoint_id in page.locator("main").inner_text()
    assert page.locator(".forks").get_by_role("link", name=fork.run_id).is_visible()
    reviewer.visit("run")

    reviewer.open(f"/decisions/{first.decision_id}")
    assert "REQUIRE_APPROVAL" in page.locator("dl.facts").first.inner_text()
    assert '"principal"' in page.locator("pre.json").inner_text()
    page.get_by_role("button", name=re.compile("Replay")).click()
    replay = page.locator("section.replay")
    replay.wait_for(timeout=WAIT_MS)
    assert "REQUIRE_APPROVAL" in replay.inner_text() and "unchanged" in replay.inner_text()
    reviewer.visit("decision")

    reviewer.open("/budgets")
    bar = page.locator("svg.bar title").first.text_content() or ""
    assert "250000 reserved" in bar and "750000 remaining of 1000000" in bar
    reviewer.visit("budgets")


def test_separation_of_duties_refusals_are_shown(browsing, ledgers, tenant, server):
    """An admin that asked for an approval may not decide it: the gate's refusal is shown."""
    from effect_ledger_client import Ledger
    from effect_ledger_client.proto import approvals_pb2

    agent, admin = ledgers["agent"], ledgers["admin"]
    tenant.set_roles("admin", "admin", "agent")
    register_irreversible(admin)
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    with Ledger(server.target, tenant.tokens["admin"]) as requester:
        approval = requester.approvals.RequestApproval(
            approvals_pb2.RequestApprovalRequest(
                run_id=run_id,
                tool=IRREVERSIBLE_TOOL,
                arguments_json=b'{"amount_cents":1}',
                target="iban:X",
                reason="a wire the admin wants",
            )
        )
    browsing_admin = browsing()
    browsing_admin.sign_in(tenant.tokens["admin"])
    page = browsing_admin.page
    card = page.locator(f'[data-approval-id="{approval.approval_id}"]')
    card.get_by_label("Reason (required)").fill("approving my own request")
    card.get_by_role("button", name="Approve").click()
    page.wait_for_url(f"**/approvals/{approval.approval_id}")
    refusal = page.locator(".flash-error").inner_text()
    assert "The gate refused to approve" in refusal and "SELF_APPROVAL" in refusal
    browsing_admin.visit("approval-refused")


def test_an_operator_settles_an_unknown_effect_as_not_happened_and_it_leaves_the_list(browsing, ledgers, tenant):
    agent, admin = ledgers["agent"], ledgers["admin"]
    register(admin, "email.send")
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "reply-9"))
    assert allowed.outcome == common_pb2.ALLOW
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))

    # A reviewer sees it but may not settle it: the gate's refusal is shown as it came.
    reviewer = browsing()
    reviewer.sign_in(tenant.tokens["reviewer"])
    reviewer.open("/effects")
    card = reviewer.page.locator(f'[data-effect-id="{allowed.effect_id}"]')
    assert "UNKNOWN" in card.locator("h2").inner_text()
    card.get_by_label("What the provider answered, and how it was asked").fill("the provider has no such message")
    card.get_by_role("button", name="Settle as not happened").click()
    reviewer.page.wait_for_url("**/effects")
    assert "ROLE_REQUIRED" in reviewer.page.locator(".flash-error").inner_text()
    reviewer.visit("effects-refused")

    operator = browsing()
    operator.sign_in(tenant.add("operator", "operator"))
    operator.open("/effects")
    card = operator.page.locator(f'[data-effect-id="{allowed.effect_id}"]')
    operator.visit("effects")
    card.get_by_label("What the provider answered, and how it was asked").fill(
        "the provider's message search for the key finds nothing"
    )
    card.get_by_role("button", name="Settle as not happened").click()
    operator.page.wait_for_url("**/effects")
    assert "it is now FAILED" in operator.page.locator(".flash-ok").inner_text()
    assert operator.page.locator(f'[data-effect-id="{allowed.effect_id}"]').count() == 0
    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert effect.stage == common_pb2.FAILED and effect.reconciled_by == "operator"


def test_an_operator_settles_an_unknown_effect_with_a_receipt(browsing, ledgers, tenant):
    agent, admin = ledgers["agent"], ledgers["admin"]
    register(admin, "email.send")
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "reply-10"))
    assert allowed.outcome == common_pb2.ALLOW
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))

    operator = browsing()
    operator.sign_in(tenant.add("operator", "operator"))
    operator.open("/effects")
    page = operator.page
    card = page.locator(f'[data-effect-id="{allowed.effect_id}"]')
    assert "UNKNOWN" in card.locator("h2").inner_text()
    card.get_by_label("Provider reference", exact=True).fill("msg-20261201-0042")
    card.get_by_label("Detail (JSON object, optional)").fill('{"status": "delivered"}')
    card.get_by_role("button", name="Settle with the receipt").click()
    page.wait_for_url("**/effects")
    assert f"Reconciled {allowed.effect_id} (email.send); it is now SUCCEEDED" in page.locator(".flash-ok").inner_text()
    assert page.locator(f'[data-effect-id="{allowed.effect_id}"]').count() == 0
    operator.visit("effects-settled")

    effect = agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=allowed.effect_id))
    assert effect.stage == common_pb2.SUCCEEDED and effect.reconciled_by == "operator"
    assert effect.receipt.provider_reference == "msg-20261201-0042"
    assert json.loads(effect.receipt.detail_json) == {"status": "delivered"}
    operator.open(f"/runs/{run_id}")
    settled = page.locator("article", has=page.locator(f"#effect-{allowed.effect_id}"))
    assert "SUCCEEDED" in settled.locator("h3").inner_text()
    assert "msg-20261201-0042" in settled.locator("dl.facts").inner_text()


def test_a_reviewer_of_another_tenant_sees_nothing(browsing, ledgers, server, database_url):
    from support import new_tenant

    agent, admin = ledgers["agent"], ledgers["admin"]
    register_irreversible(admin)
    register(admin, "email.send")
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    pending = agent.gate.AuthorizeEffect(authorize_request(run_id, "wire-2", tool=IRREVERSIBLE_TOOL))
    assert pending.outcome == common_pb2.REQUIRE_APPROVAL
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "reply-2"))
    agent.gate.RecordOutcome(unknown(allowed.attempt_id))
    admin.budgets.PutBudget(budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="tool_calls", limit=9))

    other = new_tenant(database_url)
    stranger = browsing()
    stranger.sign_in(other.tokens["reviewer"])
    page = stranger.page
    assert page.get_by_text("No approval request is waiting").is_visible()
    stranger.visit("other-tenant")
    for path, empty in (("/runs", "No run."), ("/effects", "No effect needs a human."), ("/budgets", "No budget.")):
        stranger.open(path)
        assert page.get_by_text(empty).is_visible(), path
        assert run_id not in page.content()
    for path in (f"/runs/{run_id}", f"/approvals/{pending.approval_request_id}", f"/decisions/{pending.decision_id}"):
        response = page.goto(f"{stranger.console.url}{path}")
        assert response is not None and response.status == 404, path
        assert "NOT_FOUND" in page.content()
    stranger.visit("other-tenant-refused")


def test_every_page_reads_without_javascript(browsing, ledgers, tenant):
    agent, admin = ledgers["agent"], ledgers["admin"]
    register_irreversible(admin)
    run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    pending = agent.gate.AuthorizeEffect(authorize_request(run_id, "wire-3", tool=IRREVERSIBLE_TOOL))
    admin.budgets.PutBudget(budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="tool_calls", limit=5))
    revision = agent.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).revision
    sealed = agent.checkpoints.SealCheckpoint(
        checkpoints_pb2.SealCheckpointRequest(run_id=run_id, expected_revision=revision, state_json=b'{"step":3}')
    )
    agent.checkpoints.RegisterCheckpoint(checkpoints_pb2.RegisterCheckpointRequest(checkpoint_id=sealed.checkpoint_id))
    fork = agent.checkpoints.ForkRun(
        checkpoints_pb2.ForkRunRequest(
            checkpoint_id=sealed.checkpoint_id, world=checkpoints_pb2.SIMULATED, difference="model B instead of A"
        )
    )

    plain = browsing(javascript=False)
    plain.sign_in(tenant.tokens["auditor"])
    page = plain.page
    assert pending.intent_digest in page.locator(f'[data-approval-id="{pending.approval_request_id}"]').inner_text()
    for path, expected in (
        (f"/approvals/{pending.approval_request_id}", "PENDING"),
        ("/runs", run_id),
        (f"/runs/{run_id}", "approval.requested"),
        (f"/runs/{run_id}", sealed.checkpoint_id),
        (f"/runs/{run_id}", f"forked into {fork.run_id}"),
        (f"/runs/{fork.run_id}", f"forked from {run_id} at revision {revision}"),
        ("/effects", "No effect needs a human."),
        ("/budgets", "tool_calls"),
        (f"/decisions/{pending.decision_id}", '"principal"'),
    ):
        plain.open(path)
        assert expected in page.locator("main").inner_text(), path
    plain.open(f"/decisions/{pending.decision_id}?replay=1")
    assert "Replayed" in page.locator("section.replay").inner_text()
