# The final gate's policy. The service evaluates data.effectledger.gate.decision on every
# AuthorizeEffect, with an input it builds from its own ledger (docs/policy-input.md).
#
# A missing attribute can never allow. The input's shape is checked first (`well_formed`:
# every fact a rule relies on is present, with its type), and every ALLOW needs it: engines
# differ on what a negation over an undefined reference means (OPA's Go engine and the
# embedded one did), but not on a rule that is simply not true.
package effectledger.gate

import rego.v1

# --- the input's shape -----------------------------------------------------------------

well_formed if {
	is_string(input.now)
	is_string(input.principal.id)
	is_array(input.principal.roles)
	is_string(input.run.world)
	is_array(input.run.pending_reconciliation)
	is_string(input.request.tool)
	null_or_object(input, "contract")
	null_or_object(input, "effect")
	is_string(input.ledger.verdict)
	is_boolean(input.ledger.creates_attempt)
	is_array(input.ledger.reasons)
	is_array(input.target_unknown_effects)
	is_array(input.budgets)
	is_array(input.approvals)
}

null_or_object(document, key) if is_null(document[key])

null_or_object(document, key) if is_object(document[key])

# The collections rules iterate, as arrays whatever the input holds (a malformed one is
# denied above; iterating it must not raise an evaluation error on either engine).
default approvals_given := []

approvals_given := input.approvals if is_array(input.approvals)

default budgets_given := []

budgets_given := input.budgets if is_array(input.budgets)

default unknown_on_target := []

unknown_on_target := input.target_unknown_effects if is_array(input.target_unknown_effects)

default pending_reconciliation := []

pending_reconciliation := input.run.pending_reconciliation if is_array(input.run.pending_reconciliation)

deny contains reason("INPUT_MALFORMED", "a fact the policy relies on is missing or has the wrong type") if {
	not well_formed
}

# --- denials ---------------------------------------------------------------------------

deny contains reason("TOOL_UNKNOWN", "no contract is registered for this tool") if {
	not input.contract.revision
}

deny contains reason("TOOL_RETIRED", "the tool is retired and can never be authorized") if {
	input.contract.revision
	not input.contract.retired == false
}

deny contains reason("ROLE_NOT_AGENT", "only an agent may authorize effects") if {
	not is_agent
}

is_agent if {
	is_array(input.principal.roles)
	"agent" in input.principal.roles
}

deny contains reason("TARGET_HAS_UNKNOWN_EFFECT", msg) if {
	input.ledger.verdict == "NEW_EFFECT"
	some other in unknown_on_target
	msg := sprintf("effect %s of the same tool on this target is UNKNOWN; reconcile it first", [other.effect_id])
}

# A simulated run (a fork for a counterfactual) never reaches a live tool, and a live run never
# takes a simulator for the real thing.
deny contains reason("LIVE_TOOL_IN_SIMULATED_WORLD", "a simulated run's effects never reach a live tool") if {
	input.run.world == "SIMULATED"
	not input.contract.simulator == true
}

deny contains reason("SIMULATOR_IN_LIVE_WORLD", "a simulator tool cannot act for a live run") if {
	input.run.world != "SIMULATED"
	input.contract.simulator == true
}

# After a resume, every effect open at that moment is reconciled before a new consequential one.
deny contains reason("RECONCILE_AFTER_RESUME", msg) if {
	input.ledger.creates_attempt == true
	count(pending_reconciliation) > 0
	input.contract.effect_class != "READ_ONLY"
	not retrying_an_obligation
	msg := sprintf("reconcile the effects open at the resume first: %s", [concat(", ", pending_reconciliation)])
}

retrying_an_obligation if {
	input.effect.effect_id in pending_reconciliation
	is_array(input.ledger.reasons)
	some ledger_reason in input.ledger.reasons
	ledger_reason.code == "RETRY_SAME_KEY"
}

deny contains reason("CLOCK_MISSING", "the decision time is missing or malformed") if {
	not valid_time
}

# The format is checked before parsing: a builtin error must not decide anything.
valid_time if {
	is_string(input.now)
	regex.match(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$`, input.now)
	time.parse_rfc3339_ns(input.now) > 0
}

# --- budgets ---------------------------------------------------------------------------
# The database enforces posted + pending <= limit whatever this says; denying here only
# answers earlier, with the same reason, from the facts read for this decision.

deny contains reason("BUDGET_EXHAUSTED", msg) if {
	some budget in budgets_given
	budget.estimate > budget.available
	msg := sprintf("dimension %s: the estimate %d exceeds the %d available in budget %s", [budget.dimension, budget.estimate, budget.available, budget.budget_id])
}

# --- approvals -------------------------------------------------------------------------

# Distinct reviewers an approval needs, per tool (1 when not listed).
quorums := {}

# Tools whose reusable approvals stay usable after an ALLOW (none: every approval is single-use).
reusable_approval_tools := set()

quorum := object.get(quorums, input.request.tool, 1)

needs_approval if input.contract.effect_class == "IRREVERSIBLE"

# The service computes binding_problems (run, tool, revision, digest, state, expiry, reviewers'
# current authority); policy adds its quorum.
valid_approvals contains approval.approval_id if {
	some approval in approvals_given
	count(approval.binding_problems) == 0
	count(approval.valid_approvers) >= quorum
}

deny contains reason("APPROVAL_DENIED", msg) if {
	needs_approval
	count(valid_approvals) == 0
	some approval in approvals_given
	approval.state == "DENIED"
	msg := sprintf("approval %s was denied by %s", [approval.approval_id, approval.denied_by])
}

require_approval contains reason("IRREVERSIBLE_TOOL", "an irreversible effect needs a human approval") if {
	needs_approval
	count(valid_approvals) == 0
}

chosen_approval := sort(valid_approvals)[0]

default reuse_approval := false

reuse_approval := true if {
	input.request.tool in reusable_approval_tools
	some approval in approvals_given
	approval.approval_id == chosen_approval
	approval.reusable == true
}

# --- the decision ----------------------------------------------------------------------

default decision := {"outcome": "DENY", "reasons": [{"code": "NO_RULE_MATCHED", "message": "fail closed"}]}

decision := {"outcome": "DENY", "reasons": sorted_reasons(deny)} if {
	count(deny) > 0
}

decision := {"outcome": "REQUIRE_APPROVAL", "reasons": sorted_reasons(require_approval), "quorum": quorum} if {
	count(deny) == 0
	count(require_approval) > 0
}

decision := {"outcome": "ALLOW", "reasons": []} if {
	well_formed
	is_agent
	count(deny) == 0
	count(require_approval) == 0
	not needs_approval
}

decision := {"outcome": "ALLOW", "reasons": [], "approval_id": chosen_approval, "reuse_approval": reuse_approval} if {
	well_formed
	is_agent
	count(deny) == 0
	count(require_approval) == 0
	needs_approval
}

reason(code, message) := {"code": code, "message": message}

sorted_reasons(reasons) := [r | some code in sort([c | some x in reasons; c := x.code]); some r in reasons; r.code == code]
