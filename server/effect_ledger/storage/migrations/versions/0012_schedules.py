"""scheduled intents

Revision ID: 0012
Revises: 0011
Intents to reconsider an effect later (ScheduleIntent): when each may be reconsidered, until
when, what cancels it and what budget it holds; the scheduler of every replica marks them DUE
by the database clock, at most once each (a conditional UPDATE), and the gate consumes a DUE one
at the AuthorizeEffect that follows. At most one open schedule per idempotency key (a partial
unique index). The gate's PostgreSQL functions are created again (they read whether a key has
an open schedule).

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "state IN ('SCHEDULED', 'DUE')"


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "schedules",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("schedule_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("tool_revision", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.String(length=1024), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("intent_digest", sa.String(length=64), nullable=False),
        sa.Column("effect_id", sa.String(length=64), nullable=True),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_conditions", sa.Text(), nullable=False),
        sa.Column("reservation", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("due_sequence", sa.BigInteger(), nullable=True),
        sa.Column("fired_by", sa.String(length=128), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_by", sa.String(length=128), nullable=False),
        sa.Column("close_reason", sa.Text(), nullable=False),
        sa.Column("decision_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], name=op.f("fk_schedules_tenant_id_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("tenant_id", "schedule_id", name=op.f("pk_schedules")),
    )
    op.create_index(op.f("ix_schedules_state_not_before"), "schedules", ["state", "not_before"], unique=False)
    op.create_index(op.f("ix_schedules_tenant_id_run_id"), "schedules", ["tenant_id", "run_id"], unique=False)
    op.create_index(
        op.f("ix_schedules_tenant_id_due_sequence"), "schedules", ["tenant_id", "due_sequence"], unique=False
    )
    op.create_index(
        "ix_schedules_open_key",
        "schedules",
        ["tenant_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text(OPEN),
        sqlite_where=sa.text(OPEN),
    )
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_schedules_open_key", table_name="schedules")
    op.drop_index(op.f("ix_schedules_tenant_id_due_sequence"), table_name="schedules")
    op.drop_index(op.f("ix_schedules_tenant_id_run_id"), table_name="schedules")
    op.drop_index(op.f("ix_schedules_state_not_before"), table_name="schedules")
    op.drop_table("schedules")
