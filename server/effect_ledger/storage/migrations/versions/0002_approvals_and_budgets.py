"""approvals and budgets

Revision ID: 0002
Revises: 0001
Approvals with votes and an event feed, budgets with reservations and usage records;
forks (parent and root run), default estimates, the approval an attempt consumed.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""

    op.create_table(
        "approval_events",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("principal_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "sequence", name=op.f("pk_approval_events")),
    )
    op.create_table(
        "budgets",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("budget_id", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("scope_id", sa.String(length=64), nullable=False),
        sa.Column("dimension", sa.String(length=64), nullable=False),
        sa.Column("limit_amount", sa.BigInteger(), nullable=False),
        sa.Column("posted", sa.BigInteger(), nullable=False),
        sa.Column("pending", sa.BigInteger(), nullable=False),
        sa.Column("reset_period_seconds", sa.BigInteger(), nullable=True),
        sa.Column("period_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("limit_amount >= 0", name=op.f("ck_budgets_limit_not_negative")),
        sa.CheckConstraint("pending >= 0", name=op.f("ck_budgets_pending_not_negative")),
        sa.CheckConstraint("posted >= 0", name=op.f("ck_budgets_posted_not_negative")),
        sa.PrimaryKeyConstraint("tenant_id", "budget_id", name=op.f("pk_budgets")),
        sa.UniqueConstraint(
            "tenant_id", "scope", "scope_id", "dimension", name=op.f("uq_budgets_tenant_id_scope_scope_id_dimension")
        ),
    )
    op.create_table(
        "tenant_counters",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "name", name=op.f("pk_tenant_counters")),
    )
    op.create_table(
        "approvals",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("tool_revision", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.String(length=1024), nullable=False),
        sa.Column("intent_digest", sa.String(length=64), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("requested_by", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reusable", sa.Boolean(), nullable=False),
        sa.Column("quorum", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("consumed_by_attempt", sa.String(length=64), nullable=False),
        sa.Column("revoked_by", sa.String(length=128), nullable=False),
        sa.Column("revoke_reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], name=op.f("fk_approvals_tenant_id_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "approval_id", name=op.f("pk_approvals")),
    )
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_approvals_tenant_id_run_id_intent_digest"),
            ["tenant_id", "run_id", "intent_digest"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_approvals_tenant_id_state_tool"), ["tenant_id", "state", "tool"], unique=False
        )

    op.create_table(
        "reservations",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("reservation_id", sa.String(length=64), nullable=False),
        sa.Column("budget_id", sa.String(length=64), nullable=False),
        sa.Column("attempt_id", sa.String(length=64), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=False),
        sa.Column("dimension", sa.String(length=64), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("posted_amount", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "budget_id"],
            ["budgets.tenant_id", "budgets.budget_id"],
            name=op.f("fk_reservations_tenant_id_budget_id_budgets"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "reservation_id", name=op.f("pk_reservations")),
    )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_reservations_tenant_id_attempt_id"), ["tenant_id", "attempt_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_reservations_tenant_id_budget_id_state"), ["tenant_id", "budget_id", "state"], unique=False
        )

    op.create_table(
        "usage_records",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("usage_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("segment", sa.String(length=256), nullable=False),
        sa.Column("usage", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(length=256), nullable=True),
        sa.Column("principal_id", sa.String(length=128), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["runs.tenant_id", "runs.run_id"],
            name=op.f("fk_usage_records_tenant_id_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "usage_id", name=op.f("pk_usage_records")),
        sa.UniqueConstraint("tenant_id", "request_id", name=op.f("uq_usage_records_tenant_id_request_id")),
    )
    op.create_table(
        "approval_votes",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("reviewer_id", sa.String(length=128), nullable=False),
        sa.Column("approve", sa.Boolean(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "approval_id"],
            ["approvals.tenant_id", "approvals.approval_id"],
            name=op.f("fk_approval_votes_tenant_id_approval_id_approvals"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "approval_id", "reviewer_id", name=op.f("pk_approval_votes")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approval_id", sa.String(length=64), nullable=True))

    # Existing runs are roots of their own tree: add the column, fill it, then require it.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_run_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("root_run_id", sa.String(length=64), nullable=True))
    op.execute("UPDATE runs SET root_run_id = run_id")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.alter_column("root_run_id", existing_type=sa.String(length=64), nullable=False)

    with op.batch_alter_table("tool_contracts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("default_estimate", sa.Text(), server_default="{}", nullable=False))


def downgrade() -> None:
    """Downgrade schema."""

    with op.batch_alter_table("tool_contracts", schema=None) as batch_op:
        batch_op.drop_column("default_estimate")

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("root_run_id")
        batch_op.drop_column("parent_run_id")

    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("approval_id")

    op.drop_table("approval_votes")
    op.drop_table("usage_records")
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reservations_tenant_id_budget_id_state"))
        batch_op.drop_index(batch_op.f("ix_reservations_tenant_id_attempt_id"))

    op.drop_table("reservations")
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_approvals_tenant_id_state_tool"))
        batch_op.drop_index(batch_op.f("ix_approvals_tenant_id_run_id_intent_digest"))

    op.drop_table("approvals")
    op.drop_table("tenant_counters")
    op.drop_table("budgets")
    op.drop_table("approval_events")
