# The final gate's policy. The service evaluates data.effectledger.gate.decision on every
# AuthorizeEffect, with an input it builds from its own ledger (docs/policy-input.md).
#
# Deny rules are written so that a missing attribute can never allow: each checks that the
# fact that would permit is present and right, and negation turns "undefined" into a denial.
package effectledger.gate

import rego.v1

# --- denials ---------------------------------------------------------------------------

deny contains reason("TOOL_UNKNOWN", "no contract is registered for this tool") if {
	not input.contract.revision
}

deny contains reason("TOOL_RETIRED", "the tool is retired and can never be authorized") if {
	input.contract.revision
	not input.contract.retired == false
}

deny contains reason("ROLE_NOT_AGENT", "only an agent may authorize effects") if {
	not "agent" in input.principal.roles
}

deny contains reason("TARGET_HAS_UNKNOWN_EFFECT", msg) if {
	input.ledger.verdict == "NEW_EFFECT"
	some other in input.target_unknown_effects
	msg := sprintf("effect %s of the same tool on this target is UNKNOWN; reconcile it first", [other.effect_id])
}

deny contains reason("CLOCK_MISSING", "the decision time is missing or malformed") if {
	not valid_time
}

# The format is checked before parsing: a builtin error must not decide anything.
valid_time if {
	regex.match(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$`, input.now)
	time.parse_rfc3339_ns(input.now) > 0
}

# --- approval --------------------------------------------------------------------------

require_approval contains reason("IRREVERSIBLE_TOOL", "an irreversible effect needs a human approval") if {
	input.contract.effect_class == "IRREVERSIBLE"
}

# --- the decision ----------------------------------------------------------------------

default decision := {"outcome": "DENY", "reasons": [{"code": "NO_RULE_MATCHED", "message": "fail closed"}]}

decision := {"outcome": "DENY", "reasons": sorted_reasons(deny)} if {
	count(deny) > 0
}

decision := {"outcome": "REQUIRE_APPROVAL", "reasons": sorted_reasons(require_approval)} if {
	count(deny) == 0
	count(require_approval) > 0
}

decision := {"outcome": "ALLOW", "reasons": []} if {
	count(deny) == 0
	count(require_approval) == 0
}

reason(code, message) := {"code": code, "message": message}

sorted_reasons(reasons) := [r | some code in sort([c | some x in reasons; c := x.code]); some r in reasons; r.code == code]
