"""token expiry

Revision ID: 0011
Revises: 0010
Tokens that expire, can be rotated, and can be bound to a client certificate: when each
principal's token stops working, when it was issued, and the certificate subject it needs. Authentication refuses a token past its expiry (the gate's PostgreSQL functions
too: they are created again from effect_ledger/storage/gate_store.py).

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("principals") as batch:
        batch.add_column(sa.Column("token_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("token_issued_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("client_subject", sa.String(length=1024), nullable=True))
    from effect_ledger.storage import gate_store

    gate_store.create_functions(op)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("client_subject")
        batch.drop_column("token_issued_at")
        batch.drop_column("token_expires_at")
