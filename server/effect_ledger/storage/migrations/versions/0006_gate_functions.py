"""gate functions

Revision ID: 0006
Revises: 0005
PostgreSQL only: the functions AuthorizeEffect's two round trips call (read the facts with the
effect locked; write the decision and its consequences). Their text lives in
effect_ledger/storage/gate_store.py, beside the code that calls them; this revision creates
them from it with CREATE OR REPLACE. A change of that text comes with a new revision that runs
the same statements again, so a database at head always holds the text the code calls.

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema."""
    if op.get_bind().dialect.name != "postgresql":
        return
    from effect_ledger.storage import gate_store

    op.execute(gate_store.DROP_FUNCTIONS)
