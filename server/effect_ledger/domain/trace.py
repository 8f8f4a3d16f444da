"""The run's trace as a hash chain: each event commits to its predecessor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from effect_ledger.domain.canonical import canonical_bytes, sha256_hex

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
    tenant_id: str, run_id: str, events: list[dict[str, Any]], head_revision: int, head_hash: str
) -> ChainBreak | None:
    """Walk one run's events (ordered by revision) and name the first that does not match.

    Catches an edited row (hash mismatch), a deleted or reordered row (revision gap or a
    prev_hash that is not the previous hash), and a truncated tail (head does not match).
    """
    expected_prev = GENESIS_HASH
    expected_revision = 1
    for event in events:
        revision = event["revision"]
        if revision != expected_revision:
            return ChainBreak(run_id, expected_revision, f"revision {expected_revision} missing (found {revision})")
        if event["prev_hash"] != expected_prev:
            return ChainBreak(run_id, revision, "prev_hash does not match the previous event")
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
            return ChainBreak(run_id, revision, "content does not match its hash (edited)")
        expected_prev = event["hash"]
        expected_revision += 1
    if expected_revision - 1 != head_revision or expected_prev != head_hash:
        return ChainBreak(
            run_id,
            expected_revision,
            f"run head is revision {head_revision}; the chain ends at {expected_revision - 1}",
        )
    return None
