"""The policy-engine interface and the parsing of a decision, shared by both adapters.

A decision is the value of ``data.effectledger.gate.decision``:
``{"outcome": "ALLOW" | "DENY" | "REQUIRE_APPROVAL", "reasons": [{"code": str, "message": str}]}``.
Anything else (undefined, another shape, an unknown outcome) fails closed: the gate answers
UNAVAILABLE and never ALLOW.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from effect_ledger.domain.model import Outcome, Reason
from effect_ledger.errors import PolicyUnavailable

DECISION_PACKAGE = "effectledger/gate"
# ReconcileEffect's decision: data.effectledger.reconcile.decision (ALLOW or DENY).
RECONCILE_PACKAGE = "effectledger/reconcile"
DECISION_RULE = "decision"
POLICY_OUTCOMES = {Outcome.ALLOW, Outcome.DENY, Outcome.REQUIRE_APPROVAL}
REASONS_MAX = 32


@dataclass(frozen=True)
class PolicyDecision:
    outcome: Outcome
    reasons: tuple[Reason, ...]
    engine: str
    revision: str
    # ALLOW: the approval the decision relies on (the service re-checks its binding facts).
    approval_id: str = ""
    # ALLOW: policy lets a reusable approval stay usable instead of being used up.
    reuse_approval: bool = False
    # REQUIRE_APPROVAL: distinct reviewers policy asks for.
    quorum: int = 1


class PolicyEngine(Protocol):
    name: str

    async def evaluate(
        self, policy_input: dict[str, Any], input_json: bytes | None = None, package: str = DECISION_PACKAGE
    ) -> PolicyDecision:
        """Evaluate the gate decision (or ``package``'s); raise PolicyUnavailable (never return ALLOW) on any fault.

        ``input_json``: the input already serialized (the canonical bytes the decision record
        keeps), so an engine that takes JSON text need not serialize it again."""
        ...

    async def revision(self) -> str:
        """The digest of the policy currently loaded; raise PolicyUnavailable when unknown."""
        ...

    async def close(self) -> None: ...


def undefined(detail: str) -> PolicyUnavailable:
    return PolicyUnavailable(
        f"the policy gave no valid decision: {detail}",
        reason="POLICY_UNDEFINED",
        metadata={"detail": detail[:200]},
    )


def parse_decision(value: Any, *, engine: str, revision: str, package: str = DECISION_PACKAGE) -> PolicyDecision:
    if value is None:
        raise undefined(f"data.{package.replace('/', '.')}.decision is undefined")
    if not isinstance(value, dict):
        raise undefined(f"the decision is a {type(value).__name__}, not an object")
    outcome_text = value.get("outcome")
    try:
        outcome = Outcome(str(outcome_text))
    except ValueError:
        raise undefined(f"unknown outcome {str(outcome_text)[:40]!r}") from None
    if outcome not in POLICY_OUTCOMES:
        raise undefined(f"policy may not answer {outcome.value}")
    raw_reasons = value.get("reasons", [])
    if not isinstance(raw_reasons, list) or len(raw_reasons) > REASONS_MAX:
        raise undefined("reasons must be a list of at most 32 objects")
    reasons = []
    for item in raw_reasons:
        if not isinstance(item, dict) or not isinstance(item.get("code"), str):
            raise undefined("each reason needs a string code")
        message = item.get("message", "")
        reasons.append(Reason(item["code"][:128], message[:1024] if isinstance(message, str) else ""))
    if outcome != Outcome.ALLOW and not reasons:
        raise undefined(f"{outcome.value} without a reason")
    approval_id = value.get("approval_id", "")
    reuse_approval = value.get("reuse_approval", False)
    quorum = value.get("quorum", 1)
    if not isinstance(approval_id, str) or len(approval_id) > 64:
        raise undefined("approval_id must be a string")
    if not isinstance(reuse_approval, bool):
        raise undefined("reuse_approval must be a boolean")
    if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= 10:
        raise undefined("quorum must be an integer from 1 to 10")
    return PolicyDecision(
        outcome,
        tuple(sorted(set(reasons), key=lambda r: r.code)),
        engine,
        revision,
        approval_id=approval_id if outcome == Outcome.ALLOW else "",
        reuse_approval=reuse_approval,
        quorum=quorum,
    )


def policy_files(policy_dir: Path) -> list[Path]:
    """The .rego files a decision depends on (tests excluded), in a stable order."""
    return sorted(path for path in policy_dir.rglob("*.rego") if not path.name.endswith("_test.rego"))


def revision_of(named_texts: dict[str, bytes]) -> str:
    """SHA-256 over each file's name and content digest, sorted by name."""
    outer = hashlib.sha256()
    for name in sorted(named_texts):
        outer.update(name.encode("utf-8") + b"\0" + hashlib.sha256(named_texts[name]).hexdigest().encode() + b"\n")
    return outer.hexdigest()


def default_policy_dir() -> Path:
    """The policy shipped with the package: ``policy/`` at the top of the source tree.

    A wheel carries it as the package ``effect_ledger._policy``; an editable install (whose
    import hook maps only top-level packages) reads it from the source tree.
    """
    from importlib import resources

    packaged = Path(str(resources.files("effect_ledger") / "_policy"))
    if packaged.is_dir():
        return packaged
    source_tree = Path(__file__).resolve().parents[3] / "policy"
    if not source_tree.is_dir():
        raise SystemExit("the packaged policy is missing; pass --policy-dir")
    return source_tree
