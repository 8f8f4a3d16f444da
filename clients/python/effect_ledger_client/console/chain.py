"""Checks a run's hash chain from the events the API returns, in the browser's stead.

Each event's ``hash`` is SHA-256 over its ``prev_hash``, a newline and the RFC 8785 canonical
JSON of ``{tenant_id, run_id, revision, type, payload, principal_id, created_at}``. The events
carry everything but the tenant id, which the console learns from a decision's policy input
(``principal.tenant``). Without it the links are still checked (revisions without gaps, each
``prev_hash`` equal to the hash before it, the last hash equal to the run's head) but the
hashes cannot be recomputed, and the verdict says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

# Verdicts, as the run page shows them.
VERIFIED = "verified"
LINKS_ONLY = "links verified"
BROKEN = "broken"
INCOMPLETE = "incomplete"


@dataclass(frozen=True)
class ChainEvent:
    revision: int
    type: str
    payload_json: bytes
    principal_id: str
    created_at: datetime
    prev_hash: str
    hash: str
    # The tombstone the server names when retention removed the payload ("" when it did not).
    removed_tombstone_id: str = ""


@dataclass(frozen=True)
class ChainVerdict:
    status: str
    detail: str
    # The revision where the chain first fails (0 when it does not).
    broken_at_revision: int = 0


def timestamp_text(moment: datetime) -> str:
    """The server's fixed textual form of an event time (UTC, microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _string(value: str) -> str:
    # RFC 8785 strings: the same escapes as json.dumps without ensure_ascii.
    return json.dumps(value, ensure_ascii=False)


def event_hash(event: ChainEvent, *, tenant_id: str, run_id: str) -> str:
    """The hash the server computed for ``event``. The payload arrives canonical already; the
    body's keys are written in RFC 8785 order (all ASCII, so code-point order)."""
    body = (
        '{"created_at":'
        + _string(timestamp_text(event.created_at))
        + ',"payload":'
        + event.payload_json.decode("utf-8")
        + ',"principal_id":'
        + _string(event.principal_id)
        + ',"revision":'
        + str(event.revision)
        + ',"run_id":'
        + _string(run_id)
        + ',"tenant_id":'
        + _string(tenant_id)
        + ',"type":'
        + _string(event.type)
        + "}"
    )
    return hashlib.sha256(event.prev_hash.encode("ascii") + b"\n" + body.encode("utf-8")).hexdigest()


def verify_chain(
    events: Sequence[ChainEvent],
    *,
    run_id: str,
    head_revision: int,
    head_hash: str,
    tenant_id: str | None,
    complete: bool = True,
) -> ChainVerdict:
    """Walks the events (in revision order) and names the first that does not fit.

    ``complete`` is False when the console stopped reading before the run's last event."""
    expected_prev, expected_revision, removed = "", 1, 0
    for event in events:
        if event.revision != expected_revision:
            return ChainVerdict(
                BROKEN, f"revision {expected_revision} is missing (found {event.revision})", expected_revision
            )
        if event.prev_hash != expected_prev:
            return ChainVerdict(
                BROKEN, f"revision {event.revision}: prev_hash is not the previous event's hash", event.revision
            )
        if tenant_id is not None and event_hash(event, tenant_id=tenant_id, run_id=run_id) != event.hash:
            if not _removed_by_retention(event):
                return ChainVerdict(
                    BROKEN, f"revision {event.revision}: the content does not match its hash", event.revision
                )
            removed += 1
        expected_prev, expected_revision = event.hash, expected_revision + 1
    last_revision = expected_revision - 1
    if not complete:
        return ChainVerdict(INCOMPLETE, f"only the first {last_revision} of {head_revision} events were read")
    if last_revision != head_revision or expected_prev != head_hash:
        return ChainVerdict(
            BROKEN, f"the run's head is revision {head_revision}; the chain ends at {last_revision}", expected_revision
        )
    if tenant_id is None:
        return ChainVerdict(
            LINKS_ONLY,
            f"{last_revision} events link to each other and to the run's head; their hashes were not "
            "recomputed (the tenant id, part of every hash, is not known without a decision of the run)",
        )
    if removed:
        return ChainVerdict(
            VERIFIED,
            f"{last_revision} events linked to the run's head; every hash recomputed but those of {removed} "
            "whose payload retention removed (each names its tombstone; `effect-ledger verify` checks them)",
        )
    return ChainVerdict(VERIFIED, f"{last_revision} events: every hash recomputed and linked to the run's head")


def _removed_by_retention(event: ChainEvent) -> bool:
    """The payload is exactly the marker naming the tombstone the server reports for it."""
    if not event.removed_tombstone_id:
        return False
    try:
        payload = json.loads(event.payload_json)
    except ValueError:
        return False
    marker = payload.get("removed_by_retention") if isinstance(payload, dict) and len(payload) == 1 else None
    return isinstance(marker, dict) and marker.get("tombstone_id") == event.removed_tombstone_id
