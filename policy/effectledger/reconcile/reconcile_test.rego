package effectledger.reconcile_test

import rego.v1

import data.effectledger.reconcile

# The input as the service builds it (docs/policy-input.md, "ReconcileEffect"): an operator
# settles another principal's UNKNOWN attempt as not happened.
base := {
	"version": 1,
	"now": "2026-11-30T12:00:00.000000Z",
	"principal": {"id": "ops-1", "tenant": "acme", "roles": ["operator"]},
	"effect": {"id": "eff_1", "run_id": "run_1", "tool": "email.send", "stage": "UNKNOWN", "idempotency_key": "k1"},
	"contract": {"tool": "email.send", "revision": 1, "effect_class": "RETRYABLE_WITH_KEY", "allowed_recovery": ["MANUAL_ONLY"], "queryable": false},
	"evidence": {"kind": "not_happened", "reason": "the provider has no record of it", "by_owner": false, "lookup_reference": "", "has_lookup_result": false},
	"attempts": [{"attempt_id": "att_1", "stage": "UNKNOWN", "principal_id": "agent-1", "lease_expires_at": "2026-11-30T11:00:00.000000Z"}],
	"ledger": {"refusals": []},
}

with_fact(key, value) := object.union(object.remove(base, [key]), {key: value})

test_allows_what_the_service_allows if {
	reconcile.decision == {"outcome": "ALLOW", "reasons": []} with input as base
}

test_a_service_refusal_is_a_refusal if {
	refused := with_fact("ledger", {"refusals": [{"code": "RECONCILE_NEEDS_OPERATOR", "message": "only an operator"}]})
	reconcile.decision == {"outcome": "DENY", "reasons": [{"code": "RECONCILE_NEEDS_OPERATOR", "message": "only an operator"}]} with input as refused
}

test_denies_when_any_relied_on_fact_is_missing if {
	every key in ["now", "principal", "effect", "contract", "evidence", "attempts", "ledger"] {
		reconcile.decision.outcome == "DENY" with input as object.remove(base, [key])
		"INPUT_MALFORMED" in {r.code | some r in reconcile.decision.reasons} with input as object.remove(base, [key])
	}
}

test_denies_mistyped_facts if {
	reconcile.decision.outcome == "DENY" with input as with_fact("ledger", {"refusals": "none"})
	reconcile.decision.outcome == "DENY" with input as with_fact("principal", {"id": "ops-1", "roles": "operator"})
	reconcile.decision.outcome == "DENY" with input as with_fact("contract", {"allowed_recovery": "MANUAL_ONLY"})
}

test_unknown_evidence_is_denied if {
	odd := with_fact("evidence", object.union(base.evidence, {"kind": "rumour"}))
	"EVIDENCE_UNKNOWN" in {r.code | some r in reconcile.decision.reasons} with input as odd
}

query_tool := with_fact("contract", object.union(base.contract, {"allowed_recovery": ["QUERY_THEN_RETRY"], "queryable": true}))

test_an_owner_without_a_lookup_is_denied if {
	own := object.union(query_tool, {"evidence": object.union(base.evidence, {"by_owner": true})})
	reconcile.decision.outcome == "DENY" with input as own
	"LOOKUP_EVIDENCE_REQUIRED" in {r.code | some r in reconcile.decision.reasons} with input as own
	looked_up := object.union(query_tool, {"evidence": object.union(base.evidence, {"by_owner": true, "lookup_reference": "lookup-7", "has_lookup_result": true})})
	reconcile.decision.outcome == "ALLOW" with input as looked_up
}

test_a_receipt_is_accepted if {
	receipt := with_fact("evidence", {"kind": "receipt", "reason": "", "by_owner": true, "lookup_reference": "", "has_lookup_result": false})
	reconcile.decision.outcome == "ALLOW" with input as receipt
}
