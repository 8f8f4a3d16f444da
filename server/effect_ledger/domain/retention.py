"""Retention: which material may be collected, and the marks a collection leaves.

Pure rules, no I/O (docs/retention.md explains them and the seed's reasons):

- A tenant keeps each kind of material (``Kind``) forever unless it has a rule for that kind;
  with a rule, material older than ``max_age_seconds`` by the database clock is collectable.
- A run is *retained*, and nothing of it is collected, while it has a legal hold, an effect
  AUTHORIZED, DISPATCHED or UNKNOWN (the evidence of an unresolved effect), an open schedule,
  or a pending approval (``retained_because``).
- Artifacts are shared by content digest across a tenant's runs: one referenced by a SEALED or
  REGISTERED checkpoint of a retained run is reachable and kept (``referenced_digests``).
- Effects, attempts and their receipts are never collected: they are not a ``Kind``.
- A collected trace event keeps its place, type, principal, time and hash in the run's chain;
  its payload becomes a marker naming its tombstone (``trace_marker``), which
  ``domain.trace`` tells from an edit.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from effect_ledger.domain.canonical import canonical_bytes, sha256_hex
from effect_ledger.errors import InvalidArgument

MARKER_KEY = "removed_by_retention"
# Who removed material when no principal asked (the periodic collector, `effect-ledger collect`).
COLLECTOR = "collector"

# A rule's age bounds. The floor keeps an admin's slip (seconds for hours) from emptying a
# tenant's traces at the next collection; a server may lower it (tests, demonstrations).
AGE_MIN_SECONDS_DEFAULT = 3600
AGE_MAX_SECONDS = 100 * 365 * 86_400
LEGAL_HOLD_REASON_LENGTH_MAX = 1024


# What keeps a run retained, as stored values (storage's SQL reads these; ``retained_because``
# states the rule over counts of them).
OPEN_EFFECT_STAGES = ("AUTHORIZED", "DISPATCHED", "UNKNOWN")
OPEN_SCHEDULE_STATES = ("SCHEDULED", "DUE")
# An approval someone may still act on: a reviewer (PENDING) or the agent (APPROVED, not used),
# while it has not expired.
UNRESOLVED_APPROVAL_STATES = ("PENDING", "APPROVED")
# Checkpoints whose artifacts are reachable when their run is retained.
REACHING_CHECKPOINT_STATUSES = ("SEALED", "REGISTERED")


class Kind(enum.StrEnum):
    TRACE = "TRACE"  # trace event payloads
    DECISIONS = "DECISIONS"  # decision rows with their recorded policy input
    ARTIFACTS = "ARTIFACTS"  # artifact contents
    SNAPSHOTS = "SNAPSHOTS"  # snapshot rows


@dataclass(frozen=True)
class Rule:
    kind: Kind
    max_age_seconds: int
    updated_by: str
    updated_at: datetime


def check_max_age(max_age_seconds: int, age_min_seconds: int) -> None:
    """0 removes the rule; otherwise between the server's floor and 100 years."""
    if max_age_seconds == 0:
        return
    if max_age_seconds < age_min_seconds or max_age_seconds > AGE_MAX_SECONDS:
        raise InvalidArgument.field(
            "max_age_seconds",
            f"must be 0 (keep forever) or between {age_min_seconds} and {AGE_MAX_SECONDS}",
            reason="INVALID_MAX_AGE",
        )


def cutoff(now: datetime, rule: Rule) -> datetime:
    """Material created before this instant is past its rule."""
    return now - timedelta(seconds=rule.max_age_seconds)


@dataclass(frozen=True)
class RunFacts:
    """What keeps a run retained; each count is of what is open now."""

    legal_hold: bool = False
    open_effects: int = 0
    open_schedules: int = 0
    pending_approvals: int = 0


def retained_because(facts: RunFacts) -> tuple[str, ...]:
    """Why the run is retained ("" reasons: it is not, and its aged material is collectable)."""
    reasons = []
    if facts.legal_hold:
        reasons.append("legal hold")
    if facts.open_effects:
        reasons.append("open or UNKNOWN effects")
    if facts.open_schedules:
        reasons.append("open schedules")
    if facts.pending_approvals:
        reasons.append("pending approvals")
    return tuple(reasons)


def referenced_digests(artifacts_json: str) -> set[str]:
    """The artifact digests a checkpoint's ``artifacts`` column names."""
    try:
        references = json.loads(artifacts_json)
    except ValueError:
        return set()
    if not isinstance(references, list):
        return set()
    return {r["digest"] for r in references if isinstance(r, dict) and isinstance(r.get("digest"), str)}


# --- marks ---------------------------------------------------------------------------------


def material_digest(data: bytes) -> str:
    return "sha256:" + sha256_hex(data)


def payload_digest(payload: dict[str, Any]) -> str:
    return material_digest(canonical_bytes(payload))


def trace_subject(run_id: str, revision: int) -> str:
    return f"{run_id}:{revision}"


def trace_marker(tombstone_id: str, digest_of_payload: str) -> dict[str, Any]:
    """What a collected event's payload becomes."""
    return {MARKER_KEY: {"tombstone_id": tombstone_id, "payload_digest": digest_of_payload}}


def marker_of(payload: Any) -> tuple[str, str] | None:
    """(tombstone id, payload digest) when ``payload`` is exactly a retention marker."""
    if not isinstance(payload, dict) or set(payload) != {MARKER_KEY}:
        return None
    inner = payload[MARKER_KEY]
    if not isinstance(inner, dict) or set(inner) != {"tombstone_id", "payload_digest"}:
        return None
    tombstone_id, digest = inner["tombstone_id"], inner["payload_digest"]
    if not isinstance(tombstone_id, str) or not isinstance(digest, str):
        return None
    return tombstone_id, digest


@dataclass(frozen=True)
class Tombstone:
    """What a removal leaves: what was removed, when, and under which rule."""

    tombstone_id: str
    kind: Kind
    subject: str
    run_id: str
    material_digest: str
    # A trace event's chain hash (its payload is gone, the hash stays): "" for other kinds.
    event_hash: str
    rule_max_age_seconds: int
    removed_at: datetime
    removed_by: str


def removed_metadata(tombstone: Tombstone) -> dict[str, str]:
    """ErrorInfo metadata of a read that finds only a tombstone."""
    return {
        "kind": tombstone.kind.value,
        "subject": tombstone.subject,
        "tombstone_id": tombstone.tombstone_id,
        "removed_at": tombstone.removed_at.isoformat(),
        "rule_max_age_seconds": str(tombstone.rule_max_age_seconds),
        "material_digest": tombstone.material_digest,
    }


@dataclass
class Counts:
    """What one collection removed (or, dry, would remove), per kind."""

    removed: dict[Kind, int]
    tombstones_written: int = 0
    more: bool = False

    @classmethod
    def zero(cls) -> Counts:
        return cls({kind: 0 for kind in Kind})

    def add(self, other: Counts) -> None:
        for kind, count in other.removed.items():
            self.removed[kind] += count
        self.tombstones_written += other.tombstones_written
        self.more = self.more or other.more
