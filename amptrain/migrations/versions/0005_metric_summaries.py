"""Summaries of each job's metric series at power-of-two step ranges, so a downsampled
history read does not visit every point (see amptrain/store/history/summaries.py), and the state
row telling how far they reach. Existing jobs are backfilled by SQL aggregation.

The backfill SQL is a frozen copy of the generator in amptrain/store/history/summaries.py (a
migration must not import code that may change later); tests/store/history/test_summaries.py
checks that the two give the same summaries.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BASE = 4
MAX_LEVEL = 31
SUMMARY_FIELDS = (
    "loss",
    "grad_norm",
    "loss_scale",
    "samples_per_second",
    "step_time_ms",
    "memory_allocated",
)
COUNTS = ("points", "first_step", "last_step", "skipped", "non_finite", "flagged", "first_flag")
EXTREMA_COLUMNS = tuple(
    f"{f}_{kind}{suffix}"
    for f in SUMMARY_FIELDS
    for kind in ("min", "max")
    for suffix in ("", "_step")
)
COLUMNS = (*COUNTS, *EXTREMA_COLUMNS)
_DBL_MAX = 1.7976931348623157e308


def _extrema_columns() -> list[sa.Column]:
    cols = []
    for f in SUMMARY_FIELDS:
        kind = sa.BigInteger() if f == "memory_allocated" else sa.Float(precision=53)
        for k in ("min", "max"):
            cols.append(sa.Column(f"{f}_{k}", kind, nullable=True))
            cols.append(sa.Column(f"{f}_{k}_step", sa.Integer(), nullable=True))
    return cols


def upgrade() -> None:
    op.create_table(
        "metric_summaries",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("level", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
        *(sa.Column(c, sa.Integer(), nullable=False) for c in COUNTS[:-1]),
        sa.Column("first_flag", sa.Integer(), nullable=True),
        *_extrema_columns(),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_metric_summaries_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "level", "idx", name=op.f("pk_metric_summaries")),
    )
    op.create_index(
        op.f("ix_metric_summaries_job_id_level_idx"),
        "metric_summaries",
        ["job_id", "level", "idx"],
        unique=False,
        sqlite_where=sa.text("flagged > 0"),
        postgresql_where=sa.text("flagged > 0"),
    )
    op.create_table(
        "metric_summary_state",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("stream_ms", sa.BigInteger(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("top", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_metric_summary_state_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_metric_summary_state")),
    )
    for sql in _backfill_statements(job_filter=False, dialect=op.get_bind().dialect.name):
        op.execute(sql)


def downgrade() -> None:
    op.drop_table("metric_summary_state")
    op.drop_index(op.f("ix_metric_summaries_job_id_level_idx"), table_name="metric_summaries")
    op.drop_table("metric_summaries")


def _backfill_statements(job_filter: bool, dialect: str) -> list[str]:
    """Frozen copy of amptrain.store.history.rebuild.rebuild_statements at this revision."""
    only = " AND p.job_id = :job_id" if job_filter else ""
    only_m = " AND job_id = :job_id" if job_filter else ""
    only_c = " AND c.job_id = :job_id" if job_filter else ""
    finite = "({0} IS NOT NULL AND {0} BETWEEN -{1!r} AND {1!r})".format
    flag = "(p.skipped IS TRUE OR NOT {} OR (p.grad_norm IS NOT NULL AND NOT {}))".format(
        finite("p.loss", _DBL_MAX), finite("p.grad_norm", _DBL_MAX)
    )
    ext = ", ".join(
        f"min(CASE WHEN {finite('p.' + f, _DBL_MAX)} THEN p.{f} END) AS {f}_min, "
        f"max(CASE WHEN {finite('p.' + f, _DBL_MAX)} THEN p.{f} END) AS {f}_max"
        for f in SUMMARY_FIELDS
    )
    insert_cols = "job_id, level, idx, " + ", ".join(COLUMNS)
    ext_out = ", ".join(
        f"min(a.{f}_{k}), {{{f}_{k}}}" for f in SUMMARY_FIELDS for k in ("min", "max")
    )
    steps = {
        f"{f}_{k}": f"min(CASE WHEN e.{f} = a.{f}_{k} THEN e.step END)"
        for f in SUMMARY_FIELDS
        for k in ("min", "max")
    }
    # A newer attempt at the same step. SQLite, unanalysed, would answer it from the
    # (job_id, attempt, step) index that covers it, walking all of the job's points for
    # each point: it is told which index to use.
    hint = " INDEXED BY ix_metric_points_job_id_step" if dialect == "sqlite" else ""
    newer = (
        "NOT EXISTS (SELECT 1 FROM metric_points q{1} WHERE q.job_id = {0}.job_id "
        "AND q.step = {0}.step AND q.attempt > {0}.attempt)"
    ).format
    base = (
        "WITH a AS (SELECT p.job_id, p.step / {unit} AS node, count(*) AS points, "
        "min(p.step) AS first_step, "
        "max(p.step) AS last_step, sum(CASE WHEN p.skipped IS TRUE THEN 1 ELSE 0 END) AS skipped, "
        "sum(CASE WHEN NOT {fin_loss} THEN 1 ELSE 0 END) AS non_finite, "
        "sum(CASE WHEN {flag} THEN 1 ELSE 0 END) AS flagged, "
        "min(CASE WHEN {flag} THEN p.step END) AS first_flag, {ext} "
        "FROM metric_points p WHERE {newer_p}{only} GROUP BY p.job_id, p.step / {unit}) "
        "INSERT INTO metric_summaries ({insert_cols}) "
        "SELECT a.job_id, {level}, a.node, min(a.points), min(a.first_step), min(a.last_step), "
        "min(a.skipped), min(a.non_finite), min(a.flagged), min(a.first_flag), {ext_out} "
        "FROM a JOIN metric_points e ON e.job_id = a.job_id AND {node_of_e} "
        "WHERE {newer_e} GROUP BY a.job_id, a.node"
    ).format(
        unit=1 << BASE,
        only=only,
        newer_p=newer("p", hint),
        newer_e=newer("e", hint),
        # SQLite looks each node's points up by step range; PostgreSQL hashes on the node
        # (given the range, it walks every point for each node).
        node_of_e=(
            "e.step BETWEEN a.first_step AND a.last_step"
            if dialect == "sqlite"
            else f"e.step / {1 << BASE} = a.node"
        ),
        fin_loss=finite("p.loss", _DBL_MAX),
        flag=flag,
        ext=ext,
        insert_cols=insert_cols,
        level=BASE,
        ext_out=ext_out.format(**steps),
    )
    statements = [base]
    up_ext = ", ".join(
        f"min(c.{f}_min) AS {f}_min, max(c.{f}_max) AS {f}_max" for f in SUMMARY_FIELDS
    )
    up_steps = {
        f"{f}_{k}": f"min(CASE WHEN c.{f}_{k} = a.{f}_{k} THEN c.{f}_{k}_step END)"
        for f in SUMMARY_FIELDS
        for k in ("min", "max")
    }
    for level in range(BASE, MAX_LEVEL):
        # A job gets level L+1 while its largest step is at least 2**L: a level-L node past 0.
        statements.append(
            f"WITH a AS (SELECT c.job_id, c.idx / 2 AS node, sum(c.points) AS points, "
            f"min(c.first_step) AS first_step, max(c.last_step) AS last_step, "
            f"sum(c.skipped) AS skipped, sum(c.non_finite) AS non_finite, "
            f"sum(c.flagged) AS flagged, min(c.first_flag) AS first_flag, {up_ext} "
            f"FROM metric_summaries c WHERE c.level = {level}{only_c} "
            f"AND c.job_id IN (SELECT job_id FROM metric_summaries WHERE level = {level} "
            f"AND idx >= 1{only_m}) GROUP BY c.job_id, c.idx / 2) "
            f"INSERT INTO metric_summaries ({insert_cols}) "
            f"SELECT a.job_id, {level + 1}, a.node, min(a.points), min(a.first_step), "
            f"min(a.last_step), min(a.skipped), min(a.non_finite), min(a.flagged), "
            f"min(a.first_flag), {ext_out.format(**up_steps)} "
            f"FROM a JOIN metric_summaries c ON c.job_id = a.job_id AND c.level = {level} "
            f"AND c.idx BETWEEN 2 * a.node AND 2 * a.node + 1 GROUP BY a.job_id, a.node"
        )
    statements.append(
        "INSERT INTO metric_summary_state (job_id, stream_ms, stream_seq, top) "
        "SELECT t.job_id, m.ms, (SELECT max(p.stream_seq) FROM metric_points p "
        "WHERE p.job_id = t.job_id AND p.stream_ms = m.ms), t.top "
        f"FROM (SELECT job_id, max(level) AS top FROM metric_summaries WHERE 1 = 1{only_m} "
        "GROUP BY job_id) t JOIN (SELECT p.job_id, max(p.stream_ms) AS ms FROM metric_points p "
        f"WHERE 1 = 1{only} GROUP BY p.job_id) m ON m.job_id = t.job_id"
    )
    return statements
