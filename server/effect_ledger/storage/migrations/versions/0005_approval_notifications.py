"""approval notifications

Revision ID: 0005
Revises: 0004
PostgreSQL only: every approval event row, when inserted or updated, is announced with
pg_notify on the channel effect_ledger_approval_events, so that WatchApprovals streams wait
for it instead of polling. The payload is ids only (tenant, sequence, approval), well under
NOTIFY's 8000-byte limit. Every change to an approval or its votes appends an approval event
in the same transaction, and the feed is read from those events: one trigger covers them all.
SQLite has no notifications (its streams poll a counter; see storage/notifications.py).
Triggers and functions are not part of the SQLAlchemy metadata, so the drift check does not
see them.

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Also in effect_ledger.storage.notifications.CHANNEL; a migration keeps its own copy, so that
# it means the same thing whatever the code becomes.
CHANNEL = "effect_ledger_approval_events"


def _is_postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    """Upgrade schema."""
    if not _is_postgresql():
        return
    op.execute(
        f"""
        CREATE FUNCTION effect_ledger_notify_approval_event() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(
                '{CHANNEL}',
                json_build_object(
                    'tenant_id', NEW.tenant_id, 'sequence', NEW.sequence, 'approval_id', NEW.approval_id
                )::text
            );
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER approval_events_notify AFTER INSERT OR UPDATE ON approval_events"
        " FOR EACH ROW EXECUTE FUNCTION effect_ledger_notify_approval_event()"
    )


def downgrade() -> None:
    """Downgrade schema."""
    if not _is_postgresql():
        return
    op.execute("DROP TRIGGER IF EXISTS approval_events_notify ON approval_events")
    op.execute("DROP FUNCTION IF EXISTS effect_ledger_notify_approval_event()")
