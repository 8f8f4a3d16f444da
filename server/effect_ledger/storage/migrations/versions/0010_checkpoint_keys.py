"""checkpoint keys

Revision ID: 0010
Revises: 0009
The deployment's checkpoint signing keys: its own Ed25519 key pairs (generated at the first
start, rotated with ``effect-ledger checkpoint-keys rotate``) and the public keys of other
deployments whose archives it trusts.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "checkpoint_keys",
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("private_key", sa.Text(), nullable=True),
        sa.Column("note", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_checkpoint_keys")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("checkpoint_keys")
