"""PostgreSQL storage parameters of the metric tables, so that what a running server holds
stays near what the rows need (issue 41: at most 8 bytes a value, indexes included).

The recorder rewrites each open chunk (``metric_chunks``) and the roll-ups and exemplars of
its blocks at every batch; each rewrite leaves the old row version dead. Only a vacuum
makes that space reusable, and autovacuum's default trigger (50 rows + 20 % of the table)
lets a table carry dead versions in proportion to its size: a 1M-step run's step fields
held 8.4 B a value as written against 5.8 once vacuumed. Here:

- ``autovacuum_vacuum_scale_factor = 0.01`` and ``autovacuum_vacuum_threshold = 1000`` on
  the three tables: autovacuum frees the dead versions once they are a hundredth of the
  table (or a thousand rows), each naptime, so later rows reuse their space.
- ``fillfactor = 90`` on ``metric_rollups``: its rows are small, rewritten every batch, and
  none of their indexed columns changes, so with room left on the page the rewrite is a HOT
  update that PostgreSQL prunes on the page without a vacuum and without a new index
  entry. Not on ``metric_chunks``: an open chunk grows to ~2 KiB and then shrinks when it
  is compressed at close, so reserved room is left empty by the closed chunks (measured,
  100k steps in 1,000-step batches: fillfactor 70 held 8.4 B a step-field value, 100 held
  7.0).

SQLite needs no parameter: it reuses freed pages itself, and the chunk writes keep pages
dense (:func:`amptrain.store.history.chunk_table.upsert`). Nothing here changes a row.

Downgrade: resets the parameters to the server's defaults.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VACUUM = "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000"
_PARAMETERS = {
    "metric_chunks": _VACUUM,
    "metric_rollups": f"fillfactor = 90, {_VACUUM}",
    "metric_exemplars": _VACUUM,
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, parameters in _PARAMETERS.items():
        op.execute(f"ALTER TABLE {table} SET ({parameters})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, parameters in _PARAMETERS.items():
        names = ", ".join(p.split("=")[0].strip() for p in parameters.split(","))
        op.execute(f"ALTER TABLE {table} RESET ({names})")
