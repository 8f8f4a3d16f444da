"""The Retention use cases: rules, legal holds, the collector, and reads of removed material.

The collector runs in batches, one transaction each (``BATCH_ROWS`` rows, fewer for kinds
whose rows carry payloads), so its memory is bounded by one batch whatever the tenant holds,
and a crash loses at most the batch in flight (nothing of it: the removal and its tombstones
commit together). It is idempotent: removed material no longer matches the candidate
conditions. docs/retention.md explains what is collected and what never is.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from effect_ledger.domain import retention as rules
from effect_ledger.domain.checkpoints import ArtifactStatus
from effect_ledger.domain.contracts import check_identifier, check_text
from effect_ledger.domain.model import Principal, RunEvent
from effect_ledger.domain.retention import Counts, Kind, Rule, Tombstone
from effect_ledger.errors import InvalidArgument, NotFound
from effect_ledger.storage import repository as repo
from effect_ledger.storage import retention_store as store
from effect_ledger.storage.engine import Database, UnitOfWork
from effect_ledger.storage.retention_store import HoldRecord

log = logging.getLogger(__name__)

# Rows per transaction. Trace events and snapshots carry their payload into the batch (its
# digest goes into the tombstone), so they go in smaller batches.
BATCH_ROWS = 1000
PAYLOAD_BATCH_ROWS = 250
# One CollectRetention call does at most this many batches, and starts none after half its
# deadline or this many seconds (its answer then says `more`: call again).
BATCHES_PER_CALL_MAX = 100
CALL_SECONDS_MAX = 5.0
# Tenants read at once by a collection over every tenant (periodic collector, CLI).
TENANT_PAGE_ROWS = 100
CHECKPOINT_PAGE_ROWS = 500


# --- rules and holds -----------------------------------------------------------------------


async def put_rule(unit: UnitOfWork, caller: Principal, kind: Kind, max_age_seconds: int, age_min_seconds: int) -> Rule:
    """Set the tenant's rule for ``kind``; 0 removes it (the answer then has age 0)."""
    rules.check_max_age(max_age_seconds, age_min_seconds)
    rule = Rule(kind, max_age_seconds, caller.principal_id, unit.now)
    if max_age_seconds == 0:
        await store.remove_rule(unit.connection, caller.tenant_id, kind)
    else:
        await store.put_rule(unit.connection, caller.tenant_id, rule)
    log.info(
        "retention rule: tenant=%s kind=%s max_age_seconds=%d by=%s",
        caller.tenant_id,
        kind.value,
        max_age_seconds,
        caller.principal_id,
    )
    return rule


async def list_rules(unit: UnitOfWork, caller: Principal) -> list[Rule]:
    return await store.rules(unit.connection, caller.tenant_id)


async def _require_run(unit: UnitOfWork, caller: Principal, run_id: str) -> None:
    if not run_id:
        raise InvalidArgument.field("run_id", "is required", reason="FIELD_REQUIRED")
    check_identifier(run_id, "run_id")
    if await repo.get_run(unit.connection, caller.tenant_id, run_id) is None:
        raise NotFound("run", run_id)


async def place_hold(unit: UnitOfWork, caller: Principal, run_id: str, reason: str) -> HoldRecord:
    """Hold the run; a standing hold is kept as it is (placing it again changes nothing)."""
    await _require_run(unit, caller, run_id)
    check_text(reason, "reason", required=True, length_max=rules.LEGAL_HOLD_REASON_LENGTH_MAX)
    existing = await store.get_hold(unit.connection, caller.tenant_id, run_id, lock=True)
    if existing is not None and existing.released_at is None:
        return existing
    await store.place_hold(
        unit.connection, caller.tenant_id, run_id, reason, caller.principal_id, unit.now, new=existing is None
    )
    unit.record_event(caller.tenant_id, run_id, "retention.hold_placed", {"reason": reason}, caller.principal_id)
    return HoldRecord(run_id, reason, caller.principal_id, unit.now, None, None)


async def release_hold(unit: UnitOfWork, caller: Principal, run_id: str) -> HoldRecord:
    """Release the run's hold; releasing a released hold changes nothing."""
    await _require_run(unit, caller, run_id)
    existing = await store.get_hold(unit.connection, caller.tenant_id, run_id, lock=True)
    if existing is None:
        raise NotFound("legal hold", run_id, reason="LEGAL_HOLD_NOT_FOUND")
    if existing.released_at is not None:
        return existing
    await store.release_hold(unit.connection, caller.tenant_id, run_id, caller.principal_id, unit.now)
    unit.record_event(caller.tenant_id, run_id, "retention.hold_released", {}, caller.principal_id)
    return replace(existing, released_by=caller.principal_id, released_at=unit.now)


async def list_holds(
    unit: UnitOfWork, caller: Principal, after_run_id: str, limit: int, include_released: bool
) -> list[HoldRecord]:
    return await store.holds_page(
        unit.connection, caller.tenant_id, after_run_id, limit, include_released=include_released
    )


# --- reads of removed material -------------------------------------------------------------


def removed_error(tombstone: Tombstone, resource_type: str) -> NotFound:
    """NOT_FOUND with reason REMOVED_BY_RETENTION and the tombstone in ErrorInfo metadata."""
    error = NotFound(resource_type, tombstone.subject, reason="REMOVED_BY_RETENTION")
    error.message = (
        f"{resource_type} {tombstone.subject!r} was removed by retention at {tombstone.removed_at.isoformat()} "
        f"(rule {tombstone.kind.value}, {tombstone.rule_max_age_seconds} seconds)"
    )
    error.args = (error.message,)
    error.metadata.update(rules.removed_metadata(tombstone))
    return error


async def raise_if_removed(unit: UnitOfWork, tenant_id: str, kind: Kind, subject: str, resource_type: str) -> None:
    """Called when a read finds nothing: REMOVED_BY_RETENTION when retention removed it."""
    tombstone = await store.latest_tombstone(unit.connection, tenant_id, kind, subject)
    if tombstone is not None:
        raise removed_error(tombstone, resource_type)


async def with_tombstones(unit: UnitOfWork, tenant_id: str, events: list[RunEvent]) -> list[RunEvent]:
    """Each collected event with the tombstone its marker names (an event is never shown as an
    empty payload without saying why)."""
    marked = {e.revision: m[0] for e in events if (m := rules.marker_of(e.payload)) is not None}
    if not marked:
        return events
    found = await store.tombstones_by_id(unit.connection, tenant_id, list(marked.values()))
    return [
        replace(e, removed_by_retention=found.get(marked[e.revision])) if e.revision in marked else e for e in events
    ]


async def removed_artifacts(unit: UnitOfWork, tenant_id: str, statuses: dict[str, ArtifactStatus]) -> dict[str, str]:
    """For each TOMBSTONE artifact that retention collected, what its tombstone says."""
    said = {}
    for digest in sorted(d for d, status in statuses.items() if status == ArtifactStatus.TOMBSTONE):
        tombstone = await store.latest_tombstone(unit.connection, tenant_id, Kind.ARTIFACTS, digest)
        if tombstone is not None:
            said[digest] = (
                f"removed by retention at {tombstone.removed_at.isoformat()} "
                f"(rule ARTIFACTS, {tombstone.rule_max_age_seconds} seconds; tombstone {tombstone.tombstone_id})"
            )
    return said


# --- the collector -------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    counts: Counts
    cursor: Any
    exhausted: bool


BatchWork = Callable[[UnitOfWork, Rule, Any], Awaitable[Batch]]


@dataclass(frozen=True)
class Collection:
    tenant_id: str
    removed_by: str
    dry_run: bool


def _batch(kind: Kind, found: int, written: int, cursor: Any, limit: int) -> Batch:
    counts = Counts.zero()
    counts.removed[kind] = found
    counts.tombstones_written = written
    return Batch(counts, cursor, found < limit)


def _tombstone(
    collection: Collection, unit: UnitOfWork, rule: Rule, subject: str, run_id: str, digest: str
) -> Tombstone:
    return Tombstone(
        tombstone_id=repo.new_id("tmb"),
        kind=rule.kind,
        subject=subject,
        run_id=run_id,
        material_digest=digest,
        event_hash="",
        rule_max_age_seconds=rule.max_age_seconds,
        removed_at=unit.now,
        removed_by=collection.removed_by,
    )


async def _decisions(collection: Collection, unit: UnitOfWork, rule: Rule, cursor: Any) -> Batch:
    found = await store.decision_batch(
        unit.connection,
        collection.tenant_id,
        rules.cutoff(unit.now, rule),
        unit.now,
        cursor or "",
        BATCH_ROWS,
        dry_run=collection.dry_run,
    )
    written = []
    if not collection.dry_run and found:
        written = [
            _tombstone(collection, unit, rule, r.decision_id, r.run_id, "sha256:" + r.input_digest) for r in found
        ]
        await store.delete_decisions(unit.connection, collection.tenant_id, [r.decision_id for r in found])
        await store.insert_tombstones(unit.connection, collection.tenant_id, written)
    last = found[-1].decision_id if found else cursor
    return _batch(Kind.DECISIONS, len(found), len(written), last, BATCH_ROWS)


async def _trace(collection: Collection, unit: UnitOfWork, rule: Rule, cursor: Any) -> Batch:
    found = await store.event_batch(
        unit.connection,
        collection.tenant_id,
        rules.cutoff(unit.now, rule),
        unit.now,
        cursor or ("", 0),
        PAYLOAD_BATCH_ROWS,
        dry_run=collection.dry_run,
    )
    written: list[Tombstone] = []
    if not collection.dry_run and found:
        replaced = []
        for row in found:
            digest = rules.material_digest(row.payload.encode("utf-8"))
            tombstone = _tombstone(
                collection, unit, rule, rules.trace_subject(row.run_id, row.revision), row.run_id, digest
            )
            written.append(replace(tombstone, event_hash=row.hash))
            marker = store.marker_text(rules.trace_marker(tombstone.tombstone_id, digest))
            replaced.append({"run_id": row.run_id, "revision": row.revision, "payload": marker})
        await store.replace_payloads(unit.connection, collection.tenant_id, replaced)
        await store.insert_tombstones(unit.connection, collection.tenant_id, written)
    last = (found[-1].run_id, found[-1].revision) if found else cursor
    return _batch(Kind.TRACE, len(found), len(written), last, PAYLOAD_BATCH_ROWS)


async def _snapshots(collection: Collection, unit: UnitOfWork, rule: Rule, cursor: Any) -> Batch:
    found = await store.snapshot_batch(
        unit.connection,
        collection.tenant_id,
        rules.cutoff(unit.now, rule),
        unit.now,
        cursor or "",
        PAYLOAD_BATCH_ROWS,
        dry_run=collection.dry_run,
    )
    written = []
    if not collection.dry_run and found:
        written = [
            _tombstone(collection, unit, rule, r.snapshot_id, r.run_id, rules.material_digest(r.value.encode("utf-8")))
            for r in found
        ]
        await store.delete_snapshots(unit.connection, collection.tenant_id, [r.snapshot_id for r in found])
        await store.insert_tombstones(unit.connection, collection.tenant_id, written)
    last = found[-1].snapshot_id if found else cursor
    return _batch(Kind.SNAPSHOTS, len(found), len(written), last, PAYLOAD_BATCH_ROWS)


async def _artifacts(collection: Collection, reachable: set[str], unit: UnitOfWork, rule: Rule, cursor: Any) -> Batch:
    found = await store.artifact_batch(
        unit.connection,
        collection.tenant_id,
        rules.cutoff(unit.now, rule),
        cursor or "",
        BATCH_ROWS,
        dry_run=collection.dry_run,
    )
    collectable = [r.digest for r in found if r.digest not in reachable]
    written = []
    if not collection.dry_run and collectable:
        written = [_tombstone(collection, unit, rule, digest, "", digest) for digest in collectable]
        await store.tombstone_artifacts(unit.connection, collection.tenant_id, collectable, unit.now)
        await store.insert_tombstones(unit.connection, collection.tenant_id, written)
    last = found[-1].digest if found else cursor
    batch = _batch(Kind.ARTIFACTS, len(collectable), len(written), last, BATCH_ROWS)
    return replace(batch, exhausted=len(found) < BATCH_ROWS)


async def _work_for(database: Database, collection: Collection, kind: Kind) -> BatchWork:
    if kind == Kind.DECISIONS:
        return lambda unit, rule, cursor: _decisions(collection, unit, rule, cursor)
    if kind == Kind.TRACE:
        return lambda unit, rule, cursor: _trace(collection, unit, rule, cursor)
    if kind == Kind.SNAPSHOTS:
        return lambda unit, rule, cursor: _snapshots(collection, unit, rule, cursor)
    reachable = await database.run(
        lambda unit: store.reachable_artifact_digests(
            unit.connection, collection.tenant_id, unit.now, CHECKPOINT_PAGE_ROWS
        )
    )
    return lambda unit, rule, cursor: _artifacts(collection, reachable, unit, rule, cursor)


async def _one_batch(work: BatchWork, rule: Rule, cursor: Any, unit: UnitOfWork) -> Batch:
    return await work(unit, rule, cursor)


async def _tenant_page(after: str, unit: UnitOfWork) -> list[str]:
    return await store.tenants_with_rules(unit.connection, after, TENANT_PAGE_ROWS)


async def collect(
    database: Database,
    tenant_id: str,
    removed_by: str,
    *,
    dry_run: bool,
    batches_max: int,
    stop_at: float | None = None,
) -> Counts:
    """Collect the tenant's aged, unreachable material in at most ``batches_max`` batches, and
    start no batch after ``stop_at`` (``time.monotonic()``); ``more`` says whether it stopped early."""
    tenant_rules = await database.run(lambda unit: store.rules(unit.connection, tenant_id))
    collection = Collection(tenant_id, removed_by, dry_run)
    total = Counts.zero()
    batches_left = batches_max
    for rule in sorted(tenant_rules, key=lambda r: r.kind.value):
        if total.more:
            break
        work = await _work_for(database, collection, rule.kind)
        cursor: Any = None
        while True:
            if batches_left <= 0 or (stop_at is not None and time.monotonic() >= stop_at):
                total.more = True
                break
            batches_left -= 1
            batch = await database.run(functools.partial(_one_batch, work, rule, cursor))
            total.add(batch.counts)
            cursor = batch.cursor
            if batch.exhausted:
                break
    _log_collection(total, tenant_id, removed_by, dry_run)
    return total


def _log_collection(total: Counts, tenant_id: str, removed_by: str, dry_run: bool) -> None:
    if total.tombstones_written or (dry_run and any(total.removed.values())):
        log.info(
            "retention %s: tenant=%s %s tombstones=%d more=%s by=%s",
            "dry run" if dry_run else "collected",
            tenant_id,
            " ".join(f"{k.value.lower()}={n}" for k, n in total.removed.items()),
            total.tombstones_written,
            total.more,
            removed_by,
        )


async def collect_every_tenant(database: Database, *, dry_run: bool, batches_per_tenant_max: int) -> Counts:
    """The collector over every tenant that has a rule (periodic collector, `effect-ledger collect`)."""
    total = Counts.zero()
    after = ""
    while True:
        page = await database.run(functools.partial(_tenant_page, after))
        for tenant_id in page:
            total.add(
                await collect(database, tenant_id, rules.COLLECTOR, dry_run=dry_run, batches_max=batches_per_tenant_max)
            )
        if len(page) < TENANT_PAGE_ROWS:
            return total
        after = page[-1]
