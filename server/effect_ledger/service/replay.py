"""ReplayDecision: a recorded decision's stored policy input, evaluated again under the policy
loaded now. Nothing is written; the answer says what changed and leaves why to the reasons."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.model import Decision, Outcome, Principal
from effect_ledger.errors import FailedPrecondition
from effect_ledger.policy.engine import (
    DECISION_PACKAGE,
    RECONCILE_PACKAGE,
    PolicyDecision,
    PolicyEngine,
    undefined,
)
from effect_ledger.service.gate import Gate
from effect_ledger.storage.engine import UnitOfWork


@dataclass(frozen=True)
class Replay:
    recorded: Decision
    answer: PolicyDecision
    package: str

    @property
    def outcome_changed(self) -> bool:
        return self.answer.outcome != self.recorded.outcome

    @property
    def policy_changed(self) -> bool:
        return self.answer.revision != self.recorded.policy_revision

    @property
    def reasons_added(self) -> list[str]:
        before = {r.code for r in self.recorded.reasons}
        return sorted({r.code for r in self.answer.reasons} - before)

    @property
    def reasons_removed(self) -> list[str]:
        now = {r.code for r in self.answer.reasons}
        return sorted({r.code for r in self.recorded.reasons} - now)


def package_of(policy_input: dict[str, Any]) -> str:
    """ReconcileEffect's input carries the caller's evidence; AuthorizeEffect's does not
    (docs/policy-input.md)."""
    return RECONCILE_PACKAGE if "evidence" in policy_input else DECISION_PACKAGE


async def replay_decision(
    unit: UnitOfWork, principal: Principal, gate: Gate, policy: PolicyEngine, decision_id: str
) -> Replay:
    recorded = await gate.get_decision(unit, principal, decision_id)
    if not recorded.input_json:
        raise FailedPrecondition(
            f"decision {decision_id} has no recorded policy input to replay", reason="DECISION_NOT_REPLAYABLE"
        )
    policy_input = json.loads(recorded.input_json)
    package = package_of(policy_input)
    answer = await policy.evaluate(policy_input, recorded.input_json, package)
    if package == RECONCILE_PACKAGE and answer.outcome not in (Outcome.ALLOW, Outcome.DENY):
        # What ReconcileEffect would answer to such a policy.
        raise undefined(f"the reconcile policy may answer ALLOW or DENY, not {answer.outcome.value}")
    return Replay(recorded, answer, package)
