"""Give events written before lifecycle events moved to the stream a cursor.

Until 0004 the supervisor wrote lifecycle events to SQL without a stream entry id
(``source_id`` NULL). Readers now place every event by its stream cursor, so such
rows of claimed attempts get ``{time in ms}-{row id}``: time order, unique per job.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

"""

from collections.abc import Sequence

from alembic import op


revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    integer = "BIGINT" if op.get_bind().dialect.name == "postgresql" else "INTEGER"
    op.execute(
        f"UPDATE job_events SET source_id = CAST(CAST(time * 1000 AS {integer}) AS TEXT) "
        "|| '-' || CAST(id AS TEXT) WHERE source_id IS NULL AND attempt > 0"
    )


def downgrade() -> None:
    # Data only: the cursors given here stay valid under the older code.
    pass
