"""Plain values the rules work on. Storage builds them from rows; transport maps them to protobuf."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from effect_ledger.domain.retention import Tombstone


class Role(enum.StrEnum):
    AGENT = "agent"
    REVIEWER = "reviewer"
    ADMIN = "admin"
    AUDITOR = "auditor"
    # Settles what agents left uncertain and acts on any attempt of its tenant (see
    # docs/decisions.md, "Who may act on an attempt").
    OPERATOR = "operator"


# Roles that may act on an attempt another principal was allowed (dispatch, renew, report,
# release, reconcile). Everyone else acts only on their own attempts.
RECONCILING_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})


class EffectClass(enum.StrEnum):
    READ_ONLY = "READ_ONLY"
    IDEMPOTENT = "IDEMPOTENT"
    RETRYABLE_WITH_KEY = "RETRYABLE_WITH_KEY"
    COMPENSATABLE = "COMPENSATABLE"
    IRREVERSIBLE = "IRREVERSIBLE"


class Recovery(enum.StrEnum):
    RETRY_SAME_KEY = "RETRY_SAME_KEY"
    QUERY_THEN_RETRY = "QUERY_THEN_RETRY"
    COMPENSATE = "COMPENSATE"
    MANUAL_ONLY = "MANUAL_ONLY"


class Stage(enum.StrEnum):
    AUTHORIZED = "AUTHORIZED"
    DISPATCHED = "DISPATCHED"
    UNKNOWN = "UNKNOWN"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RELEASED = "RELEASED"


OPEN_STAGES = frozenset({Stage.AUTHORIZED, Stage.DISPATCHED, Stage.UNKNOWN})
LEASED_STAGES = frozenset({Stage.AUTHORIZED, Stage.DISPATCHED})
DEFINITELY_NOT_APPLIED = frozenset({Stage.FAILED, Stage.RELEASED})


class Outcome(enum.StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    REQUIRE_APPROVAL = "REQUIRE_APPROVAL"
    DUPLICATE = "DUPLICATE"
    RECONCILE_REQUIRED = "RECONCILE_REQUIRED"


class FailureEvidence(enum.StrEnum):
    NOT_SENT = "NOT_SENT"
    PROVIDER_REJECTED = "PROVIDER_REJECTED"


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    principal_id: str
    roles: frozenset[Role]
    # The client certificate subject its token is bound to (None: not bound).
    client_subject: str | None = None

    def has_any(self, roles: frozenset[Role]) -> bool:
        return bool(self.roles & roles)


@dataclass(frozen=True)
class Reason:
    code: str
    message: str = ""

    def as_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class ToolContract:
    tool: str
    revision: int
    effect_class: EffectClass
    provider_idempotency: bool
    queryable: bool
    allowed_recovery: tuple[Recovery, ...]
    arguments_schema: dict[str, Any] | None
    max_attempts: int
    lease_seconds: int
    retired: bool = False
    retired_reason: str = ""
    created_at: datetime | None = None
    created_by: str = ""
    default_estimate: dict[str, int] = field(default_factory=dict)
    simulator: bool = False

    def same_terms(self, other: ToolContract) -> bool:
        """True when a put of ``other`` would change nothing."""
        return (
            self.effect_class == other.effect_class
            and self.provider_idempotency == other.provider_idempotency
            and self.queryable == other.queryable
            and tuple(sorted(self.allowed_recovery)) == tuple(sorted(other.allowed_recovery))
            and self.arguments_schema == other.arguments_schema
            and self.max_attempts == other.max_attempts
            and self.lease_seconds == other.lease_seconds
            and self.retired == other.retired
            and self.default_estimate == other.default_estimate
            and self.simulator == other.simulator
        )

    def as_policy_fact(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "revision": self.revision,
            "effect_class": self.effect_class.value,
            "provider_idempotency": self.provider_idempotency,
            "queryable": self.queryable,
            "allowed_recovery": sorted(r.value for r in self.allowed_recovery),
            "has_arguments_schema": self.arguments_schema is not None,
            "max_attempts": self.max_attempts,
            "lease_seconds": self.lease_seconds,
            "retired": self.retired,
            "default_estimate": dict(sorted(self.default_estimate.items())),
            "simulator": self.simulator,
        }


@dataclass(frozen=True)
class Receipt:
    provider_reference: str
    detail: Any
    digest: str
    recorded_at: datetime | None = None


@dataclass
class Attempt:
    attempt_id: str
    effect_id: str
    number: int
    stage: Stage
    provider_key: str
    provider_key_reused: bool
    lease_expires_at: datetime
    authorized_at: datetime
    decision_id: str
    dispatched_at: datetime | None = None
    finished_at: datetime | None = None
    outcome_reason: str = ""
    failure_evidence: FailureEvidence | None = None
    receipt: Receipt | None = None
    approval_id: str = ""
    # The principal whose AuthorizeEffect created it (the one that sends it).
    principal_id: str = ""


@dataclass
class Effect:
    effect_id: str
    run_id: str
    tool: str
    tool_revision: int
    target: str
    idempotency_key: str
    intent_digest: str
    arguments: dict[str, Any]
    stage: Stage
    created_at: datetime
    updated_at: datetime
    attempts: list[Attempt] = field(default_factory=list)
    reconciled_by: str = ""
    reconcile_reason: str = ""

    @property
    def receipt(self) -> Receipt | None:
        for attempt in reversed(self.attempts):
            if attempt.stage == Stage.SUCCEEDED and attempt.receipt is not None:
                return attempt.receipt
        return None


@dataclass(frozen=True)
class Run:
    tenant_id: str
    run_id: str
    created_by: str
    created_at: datetime
    revision: int
    head_hash: str
    labels: dict[str, str]
    root_run_id: str = ""
    parent_run_id: str | None = None
    world: str = "LIVE"
    forked_from_checkpoint: str | None = None
    segment: int = 1
    provider: str = ""
    model: str = ""
    adapter: str = ""


@dataclass(frozen=True)
class RunEvent:
    run_id: str
    revision: int
    type: str
    payload: dict[str, Any]
    principal_id: str
    created_at: datetime
    prev_hash: str
    hash: str
    # Set when retention removed the payload (it is then the marker naming this tombstone).
    removed_by_retention: Tombstone | None = None


@dataclass(frozen=True)
class Decision:
    decision_id: str
    run_id: str
    effect_id: str | None
    attempt_id: str | None
    outcome: Outcome
    reasons: tuple[Reason, ...]
    policy_revision: str
    engine: str
    input_digest: str
    input_json: bytes
    intent_digest: str
    idempotency_key: str
    principal_id: str
    tool: str
    created_at: datetime
