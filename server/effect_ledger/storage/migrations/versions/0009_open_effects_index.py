"""open effects index

Revision ID: 0009
Revises: 0008
Two costs that grew with the ledger. A partial index of each run's open effects (AUTHORIZED,
DISPATCHED, UNKNOWN) in effect order: the policy input lists a run's first N open effects, and
the index walks N entries where the (tenant_id, run_id, stage) index read and sorted every open
effect of the run. And el_apply updates each attempt by its key (PostgreSQL only; the functions
are created again from effect_ledger/storage/gate_store.py), where a join with the update list
was planned as a scan of the whole attempts table.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = "stage IN ('AUTHORIZED', 'DISPATCHED', 'UNKNOWN')"


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index(
        "ix_effects_open_by_run",
        "effects",
        ["tenant_id", "run_id", "effect_id"],
        unique=False,
        postgresql_where=sa.text(OPEN),
        sqlite_where=sa.text(OPEN),
    )
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_effects_open_by_run", table_name="effects")
