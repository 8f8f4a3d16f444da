# The policy for settling an effect: the service evaluates data.effectledger.reconcile.decision
# on every ReconcileEffect, with an input it builds from its own ledger (docs/policy-input.md,
# "ReconcileEffect"), and records the answer as a decision, like AuthorizeEffect's.
#
# The service's own rules hold whatever this answers (who owns an attempt, who may settle it as
# not happened, the wait after a lease): they reach this policy as input.ledger.refusals, and a
# refusal there is a refusal here. Policy can only refuse more. A missing fact never allows.
package effectledger.reconcile

import rego.v1

well_formed if {
	is_string(input.now)
	is_string(input.principal.id)
	is_array(input.principal.roles)
	is_string(input.effect.id)
	is_string(input.effect.tool)
	is_string(input.effect.stage)
	is_object(input.contract)
	is_array(input.contract.allowed_recovery)
	is_string(input.evidence.kind)
	is_array(input.attempts)
	is_array(input.ledger.refusals)
}

default ledger_refusals := []

ledger_refusals := input.ledger.refusals if is_array(input.ledger.refusals)

deny contains reason("INPUT_MALFORMED", "a fact the policy relies on is missing or has the wrong type") if {
	not well_formed
}

# The service's verdict, restated: policy cannot overrule it.
deny contains reason(refusal.code, refusal.message) if {
	some refusal in ledger_refusals
}

deny contains reason("EVIDENCE_UNKNOWN", "evidence is a receipt or the provider's answer that nothing happened") if {
	well_formed
	not input.evidence.kind in {"receipt", "not_happened"}
}

# "It happened" can only prevent a repeat: a receipt from the attempt's own principal is
# accepted. "It did not happen" reopens the intent to a new send, so it needs the evidence the
# contract asks for (the service checks the roles; this restates what the evidence must hold).
deny contains reason("LOOKUP_EVIDENCE_REQUIRED", "a QUERY_THEN_RETRY tool is settled by its own principal with the provider lookup") if {
	input.evidence.kind == "not_happened"
	input.evidence.by_owner == true
	"QUERY_THEN_RETRY" in input.contract.allowed_recovery
	not has_lookup
}

has_lookup if {
	is_string(input.evidence.lookup_reference)
	input.evidence.lookup_reference != ""
}

default decision := {"outcome": "DENY", "reasons": [{"code": "NO_RULE_MATCHED", "message": "fail closed"}]}

decision := {"outcome": "DENY", "reasons": sorted_reasons(deny)} if {
	count(deny) > 0
}

decision := {"outcome": "ALLOW", "reasons": []} if {
	well_formed
	count(deny) == 0
}

reason(code, message) := {"code": code, "message": message}

sorted_reasons(reasons) := [r | some code in sort([c | some x in reasons; c := x.code]); some r in reasons; r.code == code]
