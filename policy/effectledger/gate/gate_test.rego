package effectledger.gate_test

import rego.v1

import data.effectledger.gate

contract := {
	"tool": "email.send",
	"revision": 3,
	"effect_class": "RETRYABLE_WITH_KEY",
	"provider_idempotency": true,
	"queryable": true,
	"allowed_recovery": ["RETRY_SAME_KEY"],
	"has_arguments_schema": false,
	"max_attempts": 3,
	"lease_seconds": 60,
	"retired": false,
}

# The input as the service builds it (docs/policy-input.md), for a new effect.
base := {
	"version": 1,
	"now": "2026-11-29T12:00:00.000000Z",
	"principal": {"id": "agent-1", "tenant": "acme", "roles": ["agent"]},
	"run": {"id": "run_1", "created_by": "agent-1", "revision": 4, "labels": {}, "world": "LIVE", "segment": 1, "parent_run_id": "", "pending_reconciliation": []},
	"request": {"tool": "email.send", "target": "mailto:bob@example.com", "idempotency_key": "k1", "intent_digest": "d", "arguments": {"subject": "hi"}, "estimate": {}},
	"contract": contract,
	"pinned_contract": null,
	"effect": null,
	"ledger": {"verdict": "NEW_EFFECT", "creates_attempt": true, "reasons": []},
	"run_open_effects": [],
	"run_open_effects_truncated": false,
	"target_unknown_effects": [],
	"estimate": {},
	"budgets": [],
	"approvals": [],
}

malformed := {"outcome": "DENY", "reasons": [{"code": "INPUT_MALFORMED", "message": "a fact the policy relies on is missing or has the wrong type"}]}

# Each fact a rule relies on, removed: DENY, on every engine.
test_denies_when_any_relied_on_fact_is_missing if {
	every key in ["now", "principal", "run", "request", "contract", "effect", "ledger", "target_unknown_effects", "budgets", "approvals"] {
		gate.decision.outcome == "DENY" with input as object.remove(base, [key])
		"INPUT_MALFORMED" in {r.code | some r in gate.decision.reasons} with input as object.remove(base, [key])
	}
}

test_denies_when_a_nested_fact_is_missing_or_mistyped if {
	gate.decision == malformed with input as with_fact("principal", {"id": "agent-1", "tenant": "acme", "roles": "agent"}) with data.effectledger.gate.is_agent as true
	gate.decision.outcome == "DENY" with input as with_fact("ledger", {"verdict": "NEW_EFFECT", "reasons": []})
	gate.decision.outcome == "DENY" with input as with_fact("run", object.remove(base.run, ["pending_reconciliation"]))
	gate.decision.outcome == "DENY" with input as with_fact("request", object.remove(base.request, ["tool"]))
}

allow := {"outcome": "ALLOW", "reasons": []}

# object.union merges deeply; replacing one top-level fact needs remove-then-union.
with_fact(key, value) := object.union(object.remove(base, [key]), {key: value})

test_allows_a_registered_tool_for_an_agent if {
	gate.decision == allow with input as base
}

test_denies_an_unknown_tool if {
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "TOOL_UNKNOWN", "message": "no contract is registered for this tool"}]} with input as with_fact("contract", null)
}

test_denies_when_the_contract_is_absent_altogether if {
	gate.decision.outcome == "DENY" with input as object.remove(base, ["contract"])
}

test_denies_a_retired_tool if {
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "TOOL_RETIRED", "message": "the tool is retired and can never be authorized"}]} with input as with_fact("contract", object.union(contract, {"retired": true}))
}

test_a_contract_without_the_retired_flag_counts_as_retired if {
	gate.decision.outcome == "DENY" with input as with_fact("contract", object.remove(contract, ["retired"]))
}

test_denies_a_principal_without_the_agent_role if {
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "ROLE_NOT_AGENT", "message": "only an agent may authorize effects"}]} with input as with_fact("principal", {"id": "aud", "tenant": "acme", "roles": ["auditor"]})
}

test_denies_when_roles_are_missing if {
	gate.decision.outcome == "DENY" with input as with_fact("principal", {"id": "x", "tenant": "acme"})
}

test_denies_a_new_effect_on_a_target_with_an_unknown_effect if {
	unknown := {"effect_id": "eff_9", "run_id": "run_0", "idempotency_key": "k0"}
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "TARGET_HAS_UNKNOWN_EFFECT", "message": "effect eff_9 of the same tool on this target is UNKNOWN; reconcile it first"}]} with input as with_fact("target_unknown_effects", [unknown])
}

test_an_unknown_effect_elsewhere_does_not_block_a_retry_of_the_same_effect if {
	unknown := {"effect_id": "eff_9", "run_id": "run_0", "idempotency_key": "k1"}
	gate.decision == allow with input as object.union(with_fact("target_unknown_effects", [unknown]), {"ledger": {"verdict": "NEW_ATTEMPT"}})
}

test_requires_approval_for_an_irreversible_tool if {
	gate.decision == {"outcome": "REQUIRE_APPROVAL", "quorum": 1, "reasons": [{"code": "IRREVERSIBLE_TOOL", "message": "an irreversible effect needs a human approval"}]} with input as with_fact("contract", object.union(contract, {"effect_class": "IRREVERSIBLE"}))
}

test_a_denial_wins_over_approval if {
	gate.decision.outcome == "DENY" with input as with_fact("contract", object.union(contract, {"effect_class": "IRREVERSIBLE", "retired": true}))
}

test_denies_without_a_valid_clock if {
	gate.decision.reasons == [{"code": "CLOCK_MISSING", "message": "the decision time is missing or malformed"}] with input as with_fact("now", "yesterday")
}

test_several_denials_are_sorted_by_code if {
	codes := [r.code | some r in gate.decision.reasons] with input as object.union(with_fact("principal", {"id": "a", "tenant": "acme", "roles": []}), {"contract": null})
	codes == ["ROLE_NOT_AGENT", "TOOL_UNKNOWN"]
}

# --- approvals ---------------------------------------------------------------------------

irreversible := object.union(contract, {"effect_class": "IRREVERSIBLE"})

approval(id, problems, approvers, state) := {
	"approval_id": id,
	"state": state,
	"reusable": false,
	"quorum": 1,
	"valid_approvers": approvers,
	"denied_by": null,
	"requested_by": "agent-1",
	"binding_problems": problems,
}

with_approvals(approvals) := object.union(with_fact("contract", irreversible), {"approvals": approvals})

test_a_valid_approval_allows_and_is_named if {
	gate.decision == {"outcome": "ALLOW", "reasons": [], "approval_id": "apr_1", "reuse_approval": false} with input as with_approvals([approval("apr_1", [], ["rev-1"], "APPROVED")])
}

test_an_approval_with_binding_problems_does_not_count if {
	gate.decision.outcome == "REQUIRE_APPROVAL" with input as with_approvals([approval("apr_1", ["APPROVAL_NOT_BOUND_TO_INTENT"], ["rev-1"], "APPROVED")])
}

test_an_approval_without_approvers_does_not_count if {
	gate.decision.outcome == "REQUIRE_APPROVAL" with input as with_approvals([approval("apr_1", [], [], "APPROVED")])
}

test_a_denial_denies_and_names_itself if {
	denied := object.union(approval("apr_2", ["APPROVAL_DENIED"], [], "DENIED"), {"denied_by": "rev-2"})
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "APPROVAL_DENIED", "message": "approval apr_2 was denied by rev-2"}]} with input as with_approvals([denied])
}

test_a_new_valid_approval_wins_over_an_old_denial if {
	denied := object.union(approval("apr_2", ["APPROVAL_DENIED"], [], "DENIED"), {"denied_by": "rev-2"})
	gate.decision.approval_id == "apr_3" with input as with_approvals([denied, approval("apr_3", [], ["rev-1"], "APPROVED")])
}

test_a_quorum_counts_distinct_valid_approvers if {
	gate.decision.outcome == "REQUIRE_APPROVAL" with input as with_approvals([approval("apr_1", [], ["rev-1"], "APPROVED")]) with gate.quorums as {"email.send": 2}
	gate.decision.quorum == 2 with input as with_approvals([approval("apr_1", [], ["rev-1"], "APPROVED")]) with gate.quorums as {"email.send": 2}
	gate.decision.outcome == "ALLOW" with input as with_approvals([approval("apr_1", [], ["rev-1", "rev-2"], "APPROVED")]) with gate.quorums as {"email.send": 2}
}

test_reuse_only_for_listed_tools_and_reusable_approvals if {
	reusable := object.union(approval("apr_1", [], ["rev-1"], "APPROVED"), {"reusable": true})
	gate.decision.reuse_approval == false with input as with_approvals([reusable])
	gate.decision.reuse_approval == true with input as with_approvals([reusable]) with gate.reusable_approval_tools as {"email.send"}
	gate.decision.reuse_approval == false with input as with_approvals([approval("apr_1", [], ["rev-1"], "APPROVED")]) with gate.reusable_approval_tools as {"email.send"}
}

# --- budgets -----------------------------------------------------------------------------

test_an_estimate_over_the_available_amount_is_denied_early if {
	budget := {"budget_id": "bud_1", "scope": "TENANT", "scope_id": "", "dimension": "usd_micros", "limit": 1000, "posted": 900, "pending": 50, "available": 50, "estimate": 100}
	gate.decision == {"outcome": "DENY", "reasons": [{"code": "BUDGET_EXHAUSTED", "message": "dimension usd_micros: the estimate 100 exceeds the 50 available in budget bud_1"}]} with input as with_fact("budgets", [budget])
}

test_an_estimate_that_fits_is_allowed if {
	budget := {"budget_id": "bud_1", "scope": "TENANT", "scope_id": "", "dimension": "usd_micros", "limit": 1000, "posted": 900, "pending": 0, "available": 100, "estimate": 100}
	gate.decision == allow with input as with_fact("budgets", [budget])
}

# --- worlds and resumes ------------------------------------------------------------------

with_run(extra) := with_fact("run", object.union(base.run, extra))

test_a_simulated_run_never_reaches_a_live_tool if {
	gate.decision.reasons[0].code == "LIVE_TOOL_IN_SIMULATED_WORLD" with input as with_run({"world": "SIMULATED"})
	gate.decision == allow with input as object.union(with_run({"world": "SIMULATED"}), {"contract": {"simulator": true}})
}

test_a_live_run_never_takes_a_simulator if {
	gate.decision.reasons[0].code == "SIMULATOR_IN_LIVE_WORLD" with input as object.union(with_run({"world": "LIVE"}), {"contract": {"simulator": true}})
}

test_new_effects_wait_for_reconciliation_after_a_resume if {
	gate.decision.reasons[0].code == "RECONCILE_AFTER_RESUME" with input as with_run({"pending_reconciliation": ["eff_1"]})
	read_only := object.union(with_run({"pending_reconciliation": ["eff_1"]}), {"contract": {"effect_class": "READ_ONLY"}})
	gate.decision == allow with input as read_only
}
