"""shared rows locked last

Revision ID: 0008
Revises: 0007
PostgreSQL only: el_apply locks the rows many callers share (budget counters, the run row) with
the last statements before COMMIT, and checks a new reservation first without a lock, so that
concurrent callers do not queue on one budget row for the whole transaction. The functions are
created again from effect_ledger/storage/gate_store.py (CREATE OR REPLACE).

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema: the functions stay (their text is the code's)."""
