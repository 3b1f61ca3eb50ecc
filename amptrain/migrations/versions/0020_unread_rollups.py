"""Deletes the roll-ups no read takes: those of the reserved series other than a named
kind's cursor (:func:`amptrain.store.history.chunk_parts.rolled_up`). Revision 0016's
recorder and rebuild kept roll-ups for every series; since 0018 neither writes these (a
step point's cursor and sequence were 2 of its 13 series' upkeep), and what 0016 left
stays unread, costing space.

Which series go is ``rolled_up``'s decision, asked of the reserved (kind, name) pairs the
table holds, so the rule is stated once. Run again, it finds nothing to delete.

Downgrade: nothing to restore; revision 0018 reads no roll-up of these series either.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from amptrain.store.history.chunk_parts import RESERVED, rolled_up

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    conn = op.get_bind()
    # The prefix narrows the scan; `rolled_up` decides (LIKE has no `@` wildcard).
    pairs = conn.execute(
        sa.text("SELECT DISTINCT kind, name FROM metric_rollups WHERE name LIKE :reserved"),
        {"reserved": f"{RESERVED}%"},
    ).all()
    unread: dict[str, list[str]] = {}
    for kind, name in pairs:
        if not rolled_up(kind, name):
            unread.setdefault(kind, []).append(name)
    # One statement a kind (a scan of the table each: a few kinds, not one per series).
    delete = sa.text("DELETE FROM metric_rollups WHERE kind = :kind AND name IN :names")
    delete = delete.bindparams(sa.bindparam("names", expanding=True))
    for kind, names in unread.items():
        conn.execute(delete, {"kind": kind, "names": names})


def downgrade() -> None:
    pass
