"""attempt owner

Revision ID: 0004
Revises: 0003
Each attempt names the principal whose AuthorizeEffect created it (its owner); existing
attempts take it from the decision that created them.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("principal_id", sa.String(length=128), nullable=False, server_default=""))
    op.execute(
        "UPDATE attempts SET principal_id = (SELECT decisions.principal_id FROM decisions"
        " WHERE decisions.tenant_id = attempts.tenant_id AND decisions.decision_id = attempts.decision_id)"
        " WHERE EXISTS (SELECT 1 FROM decisions WHERE decisions.tenant_id = attempts.tenant_id"
        " AND decisions.decision_id = attempts.decision_id)"
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.alter_column("principal_id", server_default=None)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("principal_id")
