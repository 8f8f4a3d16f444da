"""retention

Revision ID: 0013
Revises: 0012
Retention rules per tenant and kind of material, legal holds on runs, and the tombstones the
collector leaves for what it removed (docs/retention.md).

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "retention_rules",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("max_age_seconds", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("max_age_seconds > 0", name=op.f("ck_retention_rules_max_age_positive")),
        sa.PrimaryKeyConstraint("tenant_id", "kind", name=op.f("pk_retention_rules")),
    )
    op.create_table(
        "legal_holds",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("placed_by", sa.String(length=128), nullable=False),
        sa.Column("placed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_by", sa.String(length=128), nullable=True),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["runs.tenant_id", "runs.run_id"],
            name=op.f("fk_legal_holds_tenant_id_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "run_id", name=op.f("pk_legal_holds")),
    )
    op.create_table(
        "tombstones",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("tombstone_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("material_digest", sa.String(length=80), nullable=False),
        sa.Column("event_hash", sa.String(length=64), nullable=True),
        sa.Column("rule_max_age_seconds", sa.BigInteger(), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "tombstone_id", name=op.f("pk_tombstones")),
    )
    op.create_index(
        op.f("ix_tombstones_tenant_id_kind_subject"), "tombstones", ["tenant_id", "kind", "subject"], unique=False
    )
    op.create_index(op.f("ix_tombstones_tenant_id_run_id"), "tombstones", ["tenant_id", "run_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_tombstones_tenant_id_run_id"), table_name="tombstones")
    op.drop_index(op.f("ix_tombstones_tenant_id_kind_subject"), table_name="tombstones")
    op.drop_table("tombstones")
    op.drop_table("legal_holds")
    op.drop_table("retention_rules")
