"""Tables. Every primary key starts with ``tenant_id`` so that tenants can later be sharded.

Schema changes go through Alembic (``migrations/``); ``tests/integration/test_migrations.py``
fails when these tables and the migrated database drift apart.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = String(64)
TENANT = String(128)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on both dialects.

    PostgreSQL stores ``timestamptz``; SQLite stores naive UTC text, which compares correctly
    as text because every value is written in the same format.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):  # type: ignore[override]
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to UtcDateTime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect):  # type: ignore[override]
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


principals = Table(
    "principals",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("principal_id", String(128), nullable=False),
    # SHA-256 of the bearer token; the token itself is shown once and never stored.
    Column("token_hash", String(64), nullable=False),
    Column("roles", Text, nullable=False),  # canonical JSON array of role names
    Column("created_at", UtcDateTime, nullable=False),
    Column("disabled_at", UtcDateTime, nullable=True),
    # When the token stops working (None: never), and when it was issued (None: at creation).
    Column("token_expires_at", UtcDateTime, nullable=True),
    Column("token_issued_at", UtcDateTime, nullable=True),
    # The client certificate subject (RFC 2253) the token is bound to: with it, the token is
    # accepted only over mTLS from that certificate. None: not bound.
    Column("client_subject", String(1024), nullable=True),
    PrimaryKeyConstraint("tenant_id", "principal_id"),
    UniqueConstraint("token_hash"),
)

tool_contracts = Table(
    "tool_contracts",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("tool", String(128), nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("effect_class", String(32), nullable=False),
    Column("provider_idempotency", Boolean, nullable=False),
    Column("queryable", Boolean, nullable=False),
    Column("allowed_recovery", Text, nullable=False),  # canonical JSON array
    Column("arguments_schema", Text, nullable=True),  # canonical JSON
    Column("max_attempts", Integer, nullable=False),
    Column("lease_seconds", Integer, nullable=False),
    Column("retired", Boolean, nullable=False),
    Column("retired_reason", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("default_estimate", Text, nullable=False, server_default="{}"),  # canonical JSON object
    Column("simulator", Boolean, nullable=False, server_default="0"),
    PrimaryKeyConstraint("tenant_id", "tool", "revision"),
)

runs = Table(
    "runs",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("head_hash", String(64), nullable=False),
    Column("labels", Text, nullable=False),  # canonical JSON object
    Column("create_request_id", String(256), nullable=True),
    # Forks: the run this one was forked from, and the root of its tree (itself for a root).
    Column("parent_run_id", ID, nullable=True),
    Column("root_run_id", ID, nullable=False),
    # LIVE or SIMULATED; a fork of a checkpoint names it.
    Column("world", String(16), nullable=False, server_default="LIVE"),
    Column("forked_from_checkpoint", ID, nullable=True),
    # The decision-maker configuration: a new segment at every resume.
    Column("segment", Integer, nullable=False, server_default="1"),
    Column("provider", String(128), nullable=False, server_default=text("''")),
    Column("model", String(128), nullable=False, server_default=text("''")),
    Column("adapter", String(128), nullable=False, server_default=text("''")),
    PrimaryKeyConstraint("tenant_id", "run_id"),
    UniqueConstraint("tenant_id", "create_request_id"),
)

run_events = Table(
    "run_events",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("type", String(64), nullable=False),
    Column("payload", Text, nullable=False),  # canonical JSON object
    Column("principal_id", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    PrimaryKeyConstraint("tenant_id", "run_id", "revision"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

effects = Table(
    "effects",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("effect_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("tool", String(128), nullable=False),
    Column("tool_revision", BigInteger, nullable=False),
    Column("target", String(1024), nullable=False),
    Column("idempotency_key", String(256), nullable=False),
    Column("intent_digest", String(64), nullable=False),
    Column("arguments", Text, nullable=False),  # canonical JSON object
    Column("stage", String(16), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("reconciled_by", String(128), nullable=False),
    Column("reconcile_reason", Text, nullable=False),
    PrimaryKeyConstraint("tenant_id", "effect_id"),
    # The database enforces one effect per (tenant, idempotency key), across every replica.
    UniqueConstraint("tenant_id", "idempotency_key"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
    Index(None, "tenant_id", "run_id", "stage"),
    Index(None, "tenant_id", "tool", "target", "stage"),
    # A run's open effects in effect order: the policy input's first N of them are read by
    # walking N index entries, however many effects the run holds (migration 0009).
    Index(
        "ix_effects_open_by_run",
        "tenant_id",
        "run_id",
        "effect_id",
        postgresql_where=text("stage IN ('AUTHORIZED', 'DISPATCHED', 'UNKNOWN')"),
        sqlite_where=text("stage IN ('AUTHORIZED', 'DISPATCHED', 'UNKNOWN')"),
    ),
)

attempts = Table(
    "attempts",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("attempt_id", ID, nullable=False),
    Column("effect_id", ID, nullable=False),
    Column("number", Integer, nullable=False),
    Column("stage", String(16), nullable=False),
    Column("provider_key", String(128), nullable=False),
    Column("provider_key_reused", Boolean, nullable=False),
    Column("lease_expires_at", UtcDateTime, nullable=False),
    Column("authorized_at", UtcDateTime, nullable=False),
    Column("dispatched_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("decision_id", ID, nullable=False),
    Column("outcome_reason", Text, nullable=False),
    Column("failure_evidence", String(32), nullable=True),
    Column("receipt_reference", String(512), nullable=True),
    Column("receipt_detail", Text, nullable=True),  # canonical JSON
    Column("receipt_digest", String(64), nullable=True),
    Column("receipt_recorded_at", UtcDateTime, nullable=True),
    Column("approval_id", ID, nullable=True),
    # The principal whose AuthorizeEffect created the attempt: its owner.
    Column("principal_id", String(128), nullable=False),
    PrimaryKeyConstraint("tenant_id", "attempt_id"),
    UniqueConstraint("tenant_id", "effect_id", "number"),
    ForeignKeyConstraint(["tenant_id", "effect_id"], ["effects.tenant_id", "effects.effect_id"]),
    # The lease sweeper scans open attempts by expiry across tenants.
    Index(None, "stage", "lease_expires_at"),
)

decisions = Table(
    "decisions",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("decision_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("effect_id", ID, nullable=True),
    Column("attempt_id", ID, nullable=True),
    Column("outcome", String(32), nullable=False),
    Column("reasons", Text, nullable=False),  # canonical JSON array of {code, message}
    Column("policy_revision", String(64), nullable=False),
    Column("engine", String(32), nullable=False),
    Column("input_digest", String(64), nullable=False),
    Column("input_json", LargeBinary, nullable=False),  # canonical JSON policy input
    Column("intent_digest", String(64), nullable=False),
    Column("idempotency_key", String(256), nullable=False),
    Column("principal_id", String(128), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "decision_id"),
    Index(None, "tenant_id", "run_id", "created_at"),
)

# --- approvals -----------------------------------------------------------------------------

approvals = Table(
    "approvals",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("approval_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("tool", String(128), nullable=False),
    Column("tool_revision", BigInteger, nullable=False),
    Column("target", String(1024), nullable=False),
    Column("intent_digest", String(64), nullable=False),
    Column("arguments", Text, nullable=False),  # canonical JSON object
    Column("requested_by", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("reusable", Boolean, nullable=False),
    Column("quorum", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("consumed_by_attempt", ID, nullable=False),
    Column("revoked_by", String(128), nullable=False),
    Column("revoke_reason", Text, nullable=False),
    PrimaryKeyConstraint("tenant_id", "approval_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
    Index(None, "tenant_id", "run_id", "intent_digest"),
    Index(None, "tenant_id", "state", "tool"),
)

approval_votes = Table(
    "approval_votes",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("approval_id", ID, nullable=False),
    Column("reviewer_id", String(128), nullable=False),
    Column("approve", Boolean, nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    # One vote per reviewer: a quorum counts distinct reviewers.
    PrimaryKeyConstraint("tenant_id", "approval_id", "reviewer_id"),
    ForeignKeyConstraint(["tenant_id", "approval_id"], ["approvals.tenant_id", "approvals.approval_id"]),
)

# Per-tenant counters (approval event sequence). Incrementing one locks its row, so sequences
# commit in order and a watcher reading "sequence > cursor" never skips a late committer.
tenant_counters = Table(
    "tenant_counters",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("name", String(64), nullable=False),
    Column("value", BigInteger, nullable=False),
    PrimaryKeyConstraint("tenant_id", "name"),
)

approval_events = Table(
    "approval_events",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("approval_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("tool", String(128), nullable=False),
    Column("type", String(64), nullable=False),
    Column("principal_id", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "sequence"),
)

# --- budgets -------------------------------------------------------------------------------

budgets = Table(
    "budgets",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("budget_id", ID, nullable=False),
    Column("scope", String(16), nullable=False),
    Column("scope_id", ID, nullable=False),  # "" for the tenant scope
    Column("dimension", String(64), nullable=False),
    Column("limit_amount", BigInteger, nullable=False),
    Column("posted", BigInteger, nullable=False),
    Column("pending", BigInteger, nullable=False),
    Column("reset_period_seconds", BigInteger, nullable=True),
    Column("period_started_at", UtcDateTime, nullable=False),
    Column("period_ends_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "budget_id"),
    UniqueConstraint("tenant_id", "scope", "scope_id", "dimension"),
    CheckConstraint("limit_amount >= 0", name="limit_not_negative"),
    CheckConstraint("posted >= 0", name="posted_not_negative"),
    CheckConstraint("pending >= 0", name="pending_not_negative"),
)

reservations = Table(
    "reservations",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("reservation_id", ID, nullable=False),
    Column("budget_id", ID, nullable=False),
    Column("attempt_id", ID, nullable=False),
    Column("effect_id", ID, nullable=False),
    Column("dimension", String(64), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("posted_amount", BigInteger, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("settled_at", UtcDateTime, nullable=True),
    PrimaryKeyConstraint("tenant_id", "reservation_id"),
    ForeignKeyConstraint(["tenant_id", "budget_id"], ["budgets.tenant_id", "budgets.budget_id"]),
    Index(None, "tenant_id", "attempt_id"),
    Index(None, "tenant_id", "budget_id", "state"),
)

usage_records = Table(
    "usage_records",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("usage_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("provider", String(128), nullable=False),
    Column("model", String(128), nullable=False),
    Column("segment", String(256), nullable=False),
    Column("usage", Text, nullable=False),  # canonical JSON object dimension -> amount
    Column("request_id", String(256), nullable=True),
    Column("principal_id", String(128), nullable=False),
    Column("recorded_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "usage_id"),
    UniqueConstraint("tenant_id", "request_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

# --- checkpoints and their sibling lifetimes ------------------------------------------------

# The deployment's checkpoint signing keys (not a tenant's): its own key pairs, the one that
# signs exports being the oldest unretired one, and public keys of other deployments whose
# archives it trusts (no private key). Every listed key verifies imports (migration 0010).
checkpoint_keys = Table(
    "checkpoint_keys",
    metadata,
    Column("key_id", String(64), nullable=False),  # SHA-256 of the raw public key, hex
    Column("public_key", Text, nullable=False),  # PEM
    Column("private_key", Text, nullable=True),  # PEM (PKCS 8); NULL for another deployment's key
    Column("note", String(256), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("retired_at", UtcDateTime, nullable=True),  # no longer signs; still verifies
    PrimaryKeyConstraint("key_id"),
)


checkpoints = Table(
    "checkpoints",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("checkpoint_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),  # SEALED or REGISTERED
    Column("format_version", Integer, nullable=False),
    Column("state", Text, nullable=False),  # canonical JSON
    Column("artifacts", Text, nullable=False),  # canonical JSON array of references
    Column("ledger", Text, nullable=False),  # canonical JSON ledger sections
    Column("manifest", Text, nullable=False),  # canonical JSON
    Column("manifest_digest", String(80), nullable=False),
    Column("facts", Text, nullable=False),  # canonical JSON compatibility facts
    Column("policy_revision", String(64), nullable=False),
    Column("sealed_by", String(128), nullable=False),
    Column("sealed_at", UtcDateTime, nullable=False),
    Column("registered_by", String(128), nullable=True),
    Column("registered_at", UtcDateTime, nullable=True),
    Column("derived_from", ID, nullable=True),
    Column("imported_from_digest", String(80), nullable=True),
    PrimaryKeyConstraint("tenant_id", "checkpoint_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
    Index(None, "tenant_id", "run_id", "revision"),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("digest", String(80), nullable=False),  # sha256:<hex>
    Column("size_bytes", BigInteger, nullable=False),
    Column("media_type", String(128), nullable=False),
    Column("status", String(16), nullable=False),  # PENDING, COMPLETE, TOMBSTONE
    Column("location", String(1024), nullable=False),
    Column("content", LargeBinary, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "digest"),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("snapshot_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("value", Text, nullable=False),  # canonical JSON
    Column("created_by", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "snapshot_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

provider_sessions = Table(
    "provider_sessions",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("reference_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("provider", String(128), nullable=False),
    Column("session_id", String(512), nullable=False),
    Column("response_id", String(512), nullable=False),
    Column("expires_at", UtcDateTime, nullable=True),
    Column("observed_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "reference_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

execution_handles = Table(
    "execution_handles",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("handle_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("runtime", String(128), nullable=False),
    Column("handle", String(512), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "handle_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

# After a resume, every effect open at that moment must be settled before the run may start a
# new consequential effect; the gate reads these rows (joined with the effects' stages).
resume_obligations = Table(
    "resume_obligations",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("effect_id", ID, nullable=False),
    Column("checkpoint_id", ID, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "run_id", "effect_id"),
)

# --- scheduled intents (migration 0012) -----------------------------------------------------

# An intention to reconsider an effect later: not before ``not_before`` (by the database's
# clock), not after ``deadline``. Every replica's scheduler moves SCHEDULED to DUE with one
# conditional UPDATE, so one intent fires once whatever the number of replicas; the gate
# consumes a DUE one at the AuthorizeEffect that follows, under the policy current then.
# ``due_sequence`` orders the tenant's firings for WatchDueIntents (a tenant counter).
OPEN_SCHEDULE = "state IN ('SCHEDULED', 'DUE')"

schedules = Table(
    "schedules",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("schedule_id", ID, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("idempotency_key", String(256), nullable=False),
    Column("tool", String(128), nullable=False),
    Column("tool_revision", BigInteger, nullable=False),
    Column("target", String(1024), nullable=False),
    Column("arguments", Text, nullable=False),  # canonical JSON object
    Column("intent_digest", String(64), nullable=False),
    Column("effect_id", ID, nullable=True),  # the effect it retries, if there is one yet
    Column("purpose", String(32), nullable=False),
    Column("not_before", UtcDateTime, nullable=False),
    Column("deadline", UtcDateTime, nullable=True),
    Column("cancel_conditions", Text, nullable=False),  # canonical JSON array
    Column("reservation", Text, nullable=False),  # canonical JSON object: dimension -> amount held
    Column("state", String(16), nullable=False),
    Column("note", Text, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("due_at", UtcDateTime, nullable=True),
    Column("due_sequence", BigInteger, nullable=True),
    Column("fired_by", String(128), nullable=True),  # the replica whose scheduler fired it
    Column("closed_at", UtcDateTime, nullable=True),
    Column("closed_by", String(128), nullable=False),
    Column("close_reason", Text, nullable=False),
    Column("decision_id", ID, nullable=True),  # the AuthorizeEffect that consumed it
    PrimaryKeyConstraint("tenant_id", "schedule_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
    Index(None, "state", "not_before"),
    Index(None, "tenant_id", "run_id"),
    Index(None, "tenant_id", "due_sequence"),
    Index(
        "ix_schedules_open_key",
        "tenant_id",
        "idempotency_key",
        unique=True,
        postgresql_where=text(OPEN_SCHEDULE),
        sqlite_where=text(OPEN_SCHEDULE),
    ),
)

# --- retention (migration 0013) -------------------------------------------------------------

# A tenant's rule per kind of material (TRACE, DECISIONS, ARTIFACTS, SNAPSHOTS): material older
# than max_age_seconds by the database clock may be collected. No row: kept forever.
retention_rules = Table(
    "retention_rules",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("max_age_seconds", BigInteger, nullable=False),
    Column("updated_by", String(128), nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("tenant_id", "kind"),
    CheckConstraint("max_age_seconds > 0", name="max_age_positive"),
)

# One row per run that was ever held; the hold stands while released_at is NULL. Placing a
# hold again after a release starts a new one (the trace of the run keeps every change).
legal_holds = Table(
    "legal_holds",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("run_id", ID, nullable=False),
    Column("reason", Text, nullable=False),
    Column("placed_by", String(128), nullable=False),
    Column("placed_at", UtcDateTime, nullable=False),
    Column("released_by", String(128), nullable=True),
    Column("released_at", UtcDateTime, nullable=True),
    PrimaryKeyConstraint("tenant_id", "run_id"),
    ForeignKeyConstraint(["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"]),
)

# What the collector removed: written in the transaction of the removal. ``subject`` names the
# removed thing (a decision id, "<run_id>:<revision>" for a trace event, an artifact digest, a
# snapshot id); ``event_hash`` is a trace event's chain hash, which `effect-ledger verify`
# checks the event against once its payload is gone.
tombstones = Table(
    "tombstones",
    metadata,
    Column("tenant_id", TENANT, nullable=False),
    Column("tombstone_id", ID, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("subject", String(256), nullable=False),
    Column("run_id", ID, nullable=True),
    Column("material_digest", String(80), nullable=False),
    Column("event_hash", String(64), nullable=True),
    Column("rule_max_age_seconds", BigInteger, nullable=False),
    Column("removed_at", UtcDateTime, nullable=False),
    Column("removed_by", String(128), nullable=False),
    PrimaryKeyConstraint("tenant_id", "tombstone_id"),
    Index(None, "tenant_id", "kind", "subject"),
    Index(None, "tenant_id", "run_id"),
)
