"""initial schema

Revision ID: 0001
Revises:
Every primary key starts with tenant_id. Frozen: later changes get their own revision.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""

    op.create_table(
        "decisions",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("decision_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=True),
        sa.Column("attempt_id", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("reasons", sa.Text(), nullable=False),
        sa.Column("policy_revision", sa.String(length=64), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("input_digest", sa.String(length=64), nullable=False),
        sa.Column("input_json", sa.LargeBinary(), nullable=False),
        sa.Column("intent_digest", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("principal_id", sa.String(length=128), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "decision_id", name=op.f("pk_decisions")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_decisions_tenant_id_run_id_created_at"), ["tenant_id", "run_id", "created_at"], unique=False
        )

    op.create_table(
        "principals",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("principal_id", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("roles", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "principal_id", name=op.f("pk_principals")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_principals_token_hash")),
    )
    op.create_table(
        "runs",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(length=64), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("create_request_id", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint("tenant_id", "create_request_id", name=op.f("uq_runs_tenant_id_create_request_id")),
    )
    op.create_table(
        "tool_contracts",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("effect_class", sa.String(length=32), nullable=False),
        sa.Column("provider_idempotency", sa.Boolean(), nullable=False),
        sa.Column("queryable", sa.Boolean(), nullable=False),
        sa.Column("allowed_recovery", sa.Text(), nullable=False),
        sa.Column("arguments_schema", sa.Text(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_seconds", sa.Integer(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.Column("retired_reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "tool", "revision", name=op.f("pk_tool_contracts")),
    )
    op.create_table(
        "effects",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("tool_revision", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.String(length=1024), nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("intent_digest", sa.String(length=64), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reconciled_by", sa.String(length=128), nullable=False),
        sa.Column("reconcile_reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], name=op.f("fk_effects_tenant_id_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "effect_id", name=op.f("pk_effects")),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name=op.f("uq_effects_tenant_id_idempotency_key")),
    )
    with op.batch_alter_table("effects", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_effects_tenant_id_run_id_stage"), ["tenant_id", "run_id", "stage"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_effects_tenant_id_tool_target_stage"), ["tenant_id", "tool", "target", "stage"], unique=False
        )

    op.create_table(
        "run_events",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("principal_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], name=op.f("fk_run_events_tenant_id_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "run_id", "revision", name=op.f("pk_run_events")),
    )
    op.create_table(
        "attempts",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("attempt_id", sa.String(length=64), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("provider_key", sa.String(length=128), nullable=False),
        sa.Column("provider_key_reused", sa.Boolean(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("authorized_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decision_id", sa.String(length=64), nullable=False),
        sa.Column("outcome_reason", sa.Text(), nullable=False),
        sa.Column("failure_evidence", sa.String(length=32), nullable=True),
        sa.Column("receipt_reference", sa.String(length=512), nullable=True),
        sa.Column("receipt_detail", sa.Text(), nullable=True),
        sa.Column("receipt_digest", sa.String(length=64), nullable=True),
        sa.Column("receipt_recorded_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "effect_id"],
            ["effects.tenant_id", "effects.effect_id"],
            name=op.f("fk_attempts_tenant_id_effect_id_effects"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "attempt_id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("tenant_id", "effect_id", "number", name=op.f("uq_attempts_tenant_id_effect_id_number")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_attempts_stage_lease_expires_at"), ["stage", "lease_expires_at"], unique=False
        )


def downgrade() -> None:
    """Downgrade schema."""

    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_stage_lease_expires_at"))

    op.drop_table("attempts")
    op.drop_table("run_events")
    with op.batch_alter_table("effects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_effects_tenant_id_tool_target_stage"))
        batch_op.drop_index(batch_op.f("ix_effects_tenant_id_run_id_stage"))

    op.drop_table("effects")
    op.drop_table("tool_contracts")
    op.drop_table("runs")
    op.drop_table("principals")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decisions_tenant_id_run_id_created_at"))

    op.drop_table("decisions")
