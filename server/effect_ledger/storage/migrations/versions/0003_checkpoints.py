"""checkpoints

Revision ID: 0003
Revises: 0002
Checkpoints with artifacts, snapshots, provider session references, execution handles,
resume obligations; forks and configuration segments on runs; simulator tools.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""

    op.create_table(
        "artifacts",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("location", sa.String(length=1024), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "digest", name=op.f("pk_artifacts")),
    )
    op.create_table(
        "resume_obligations",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "run_id", "effect_id", name=op.f("pk_resume_obligations")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("format_version", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("artifacts", sa.Text(), nullable=False),
        sa.Column("ledger", sa.Text(), nullable=False),
        sa.Column("manifest", sa.Text(), nullable=False),
        sa.Column("manifest_digest", sa.String(length=80), nullable=False),
        sa.Column("facts", sa.Text(), nullable=False),
        sa.Column("policy_revision", sa.String(length=64), nullable=False),
        sa.Column("sealed_by", sa.String(length=128), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("registered_by", sa.String(length=128), nullable=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("derived_from", sa.String(length=64), nullable=True),
        sa.Column("imported_from_digest", sa.String(length=80), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["runs.tenant_id", "runs.run_id"],
            name=op.f("fk_checkpoints_tenant_id_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "checkpoint_id", name=op.f("pk_checkpoints")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_checkpoints_tenant_id_run_id_revision"), ["tenant_id", "run_id", "revision"], unique=False
        )

    op.create_table(
        "execution_handles",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("handle_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("runtime", sa.String(length=128), nullable=False),
        sa.Column("handle", sa.String(length=512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["runs.tenant_id", "runs.run_id"],
            name=op.f("fk_execution_handles_tenant_id_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "handle_id", name=op.f("pk_execution_handles")),
    )
    op.create_table(
        "provider_sessions",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("reference_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=512), nullable=False),
        sa.Column("response_id", sa.String(length=512), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["runs.tenant_id", "runs.run_id"],
            name=op.f("fk_provider_sessions_tenant_id_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "reference_id", name=op.f("pk_provider_sessions")),
    )
    op.create_table(
        "snapshots",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("snapshot_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], name=op.f("fk_snapshots_tenant_id_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "snapshot_id", name=op.f("pk_snapshots")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("world", sa.String(length=16), server_default="LIVE", nullable=False))
        batch_op.add_column(sa.Column("forked_from_checkpoint", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("segment", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("provider", sa.String(length=128), server_default=sa.text("''"), nullable=False))
        batch_op.add_column(sa.Column("model", sa.String(length=128), server_default=sa.text("''"), nullable=False))
        batch_op.add_column(sa.Column("adapter", sa.String(length=128), server_default=sa.text("''"), nullable=False))

    with op.batch_alter_table("tool_contracts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("simulator", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    """Downgrade schema."""

    with op.batch_alter_table("tool_contracts", schema=None) as batch_op:
        batch_op.drop_column("simulator")

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("adapter")
        batch_op.drop_column("model")
        batch_op.drop_column("provider")
        batch_op.drop_column("segment")
        batch_op.drop_column("forked_from_checkpoint")
        batch_op.drop_column("world")

    op.drop_table("snapshots")
    op.drop_table("provider_sessions")
    op.drop_table("execution_handles")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_tenant_id_run_id_revision"))

    op.drop_table("checkpoints")
    op.drop_table("resume_obligations")
    op.drop_table("artifacts")
