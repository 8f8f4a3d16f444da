"""settled keys read without a lock

Revision ID: 0007
Revises: 0006
PostgreSQL only: el_authorize_facts reads a SUCCEEDED effect without locking its row (its
answer, DUPLICATE, cannot change), so retries of a settled key do not queue on one row. The
functions are created again from effect_ledger/storage/gate_store.py (CREATE OR REPLACE).

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema: the functions stay (0006 created them; their text is the code's)."""
