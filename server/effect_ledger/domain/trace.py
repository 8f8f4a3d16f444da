"""The run's trace as a hash chain: each event commits to its predecessor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from effect_ledger.domain.canonical import canonical_bytes, sha256_hex
from effect_ledger.domain.retention import Kind, Tombstone, marker_of, trace_subject

GENESIS_HASH = ""


def timestamp_text(moment: datetime) -> str:
    """A fixed textual form (UTC, microseconds) so a hash never depends on a driver's types."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_hash(
    *,
    prev_hash: str,
    tenant_id: str,
    run_id: str,
    revision: int,
    event_type: str,
    payload: dict[str, Any],
    principal_id: str,
    created_at: datetime,
) -> str:
    body = {
        "tenant_id": tenant_id,
        "run_id": run_id,
        "revision": revision,
        "type": event_type,
        "payload": payload,
        "principal_id": principal_id,
        "created_at": timestamp_text(created_at),
    }
    return sha256_hex(prev_hash.encode("ascii") + b"\n" + canonical_bytes(body))


@dataclass(frozen=True)
class ChainBreak:
    run_id: str
    revision: int
    problem: str


def first_break(
    tenant_id: str,
    run_id: str,
    events: list[dict[str, Any]],
    head_revision: int,
    head_hash: str,
    tombstones: Mapping[str, Tombstone] | None = None,
) -> ChainBreak | None:
    """The first event that does not match, or None (``walk_chain`` without the count)."""
    return walk_chain(tenant_id, run_id, events, head_revision, head_hash, tombstones).chain_break


@dataclass(frozen=True)
class ChainWalk:
    chain_break: ChainBreak | None
    # Events whose payload retention removed, each vouched for by its tombstone.
    removed_by_retention: int


def _removed_problem(run_id: str, event: dict[str, Any], tombstones: Mapping[str, Tombstone]) -> str | None:
    """Why a collected event's marker is not vouched for by its tombstone (None: it is).

    The payload is gone, so its hash cannot be recomputed: the tombstone, written in the
    collection's transaction, recorded the event's hash and payload digest; the next event's
    prev_hash (or the run's head) still commits to that hash.
    """
    marker = marker_of(event["payload"])
    if marker is None:
        return "content does not match its hash (edited)"
    tombstone_id, digest = marker
    tombstone = tombstones.get(tombstone_id)
    if tombstone is None:
        return f"content does not match its hash (edited): retention marker {tombstone_id} has no tombstone"
    expected_subject = trace_subject(run_id, event["revision"])
    if tombstone.kind != Kind.TRACE or tombstone.subject != expected_subject:
        return f"tombstone {tombstone_id} names {tombstone.kind.value} {tombstone.subject}, not this event"
    if tombstone.event_hash != event["hash"]:
        return f"tombstone {tombstone_id} recorded another hash for this event (tampered)"
    if tombstone.material_digest != digest:
        return f"tombstone {tombstone_id} recorded another payload digest (tampered)"
    return None


def walk_chain(
    tenant_id: str,
    run_id: str,
    events: list[dict[str, Any]],
    head_revision: int,
    head_hash: str,
    tombstones: Mapping[str, Tombstone] | None = None,
) -> ChainWalk:
    """Walk one run's events (ordered by revision) and name the first that does not match.

    Catches an edited row (hash mismatch), a deleted or reordered row (revision gap or a
    prev_hash that is not the previous hash), and a truncated tail (head does not match). An
    event whose payload retention removed passes only when its tombstone (``tombstones``, by
    tombstone id) names it, with its hash; it is counted, not hidden.
    """
    known = tombstones or {}
    expected_prev = GENESIS_HASH
    expected_revision = 1
    removed = 0
    for event in events:
        revision = event["revision"]
        if revision != expected_revision:
            problem = f"revision {expected_revision} missing (found {revision})"
            return ChainWalk(ChainBreak(run_id, expected_revision, problem), removed)
        if event["prev_hash"] != expected_prev:
            return ChainWalk(ChainBreak(run_id, revision, "prev_hash does not match the previous event"), removed)
        recomputed = event_hash(
            prev_hash=event["prev_hash"],
            tenant_id=tenant_id,
            run_id=run_id,
            revision=revision,
            event_type=event["type"],
            payload=event["payload"],
            principal_id=event["principal_id"],
            created_at=event["created_at"],
        )
        if recomputed != event["hash"]:
            unvouched = _removed_problem(run_id, event, known)
            if unvouched is not None:
                return ChainWalk(ChainBreak(run_id, revision, unvouched), removed)
            removed += 1
        expected_prev = event["hash"]
        expected_revision += 1
    if expected_revision - 1 != head_revision or expected_prev != head_hash:
        return ChainWalk(
            ChainBreak(
                run_id,
                expected_revision,
                f"run head is revision {head_revision}; the chain ends at {expected_revision - 1}",
            ),
            removed,
        )
    return ChainWalk(None, removed)
