"""Drop the per-value row tables (``metric_points``, ``metric_values``) and the step summaries
(``metric_summaries``, ``metric_summary_state``): every read comes from the chunks and their
roll-ups, and the recorder writes nothing else.

First every row must be in the chunks. Per job that has rows, the check compares, per
attempt, how many points its rows hold with how many steps each step series' chunks hold
(:data:`~amptrain.store.history.chunk_parts.STEP_SERIES` and the cursor series), and per
kind, name and attempt how many values its rows hold with its chunks' count (and its
records with the record series'). A chunk only ever got its steps from the recorder's batch
that also wrote the rows (or from 0014/0015 moving them), so equal counts mean every row is
there. A job that falls short has its rows moved again the way 0014 and 0015 moved them:
primary-key batches of :data:`BATCH` rows, a value batch ending at a record's end
(0015's ``_batch``), merged by :func:`amptrain.store.history.chunk_writes.append`, where a
step already in a chunk keeps its value; then its roll-ups are rebuilt
(:func:`amptrain.store.history.rollup_rebuild.rebuild`). A job whose level-0 roll-ups do
not match its chunks' counts is rebuilt too. Interrupted (SQLite commits what it did;
PostgreSQL rolls the revision back) and run again, it finds what is left to do and ends
with the same chunks and roll-ups.

Downgrade: recreates the four tables as revision 0016 had them and rebuilds the ROWS from
the chunks (every attempt's points and named values, with their cursors, through the
cursor pages' own reads, a page of :data:`BATCH` records at a time). The summaries' tables
come back empty: revision 0005's reads fall back to the points for a job without summary
state, as they did for points written without summaries, so nothing is lost.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

"""

import importlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.contract.metrics import STEP_METRICS, STORED_METRIC_FIELDS, VALUE_KINDS
from amptrain.store.history import chunk_writes, rollup_rebuild
from amptrain.store.history.chunk_parts import MS, RECORD_SERIES, SEQ, STEP_KIND, STEP_SERIES

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 50_000
"""Rows per batch of a move, records per page of the downgrade: tens of MiB at most."""
_0015 = importlib.import_module("amptrain.migrations.versions.0015_record_series")
"""0015's value batches, which end at a record's end (a record's places need it whole)."""
DROPPED = ("metric_summary_state", "metric_summaries", "metric_values", "metric_points")


def upgrade() -> None:
    s = Session(bind=op.get_bind())
    for job_id in _jobs_with_rows(s):
        moved = False
        if not _points_in_chunks(s, job_id):
            _move(s, job_id, _POINTS, whole_records=False)
            moved = True
        if not _values_in_chunks(s, job_id):
            _move(s, job_id, _VALUES, whole_records=True)
            moved = True
        if moved or not _rollups_match(s, job_id):
            rollup_rebuild.rebuild(s, job_id, exemplars=False)  # their table comes with 0018
    s.flush()
    for table in DROPPED:
        op.drop_table(table)


def _jobs_with_rows(s: Session) -> list[str]:
    rows = s.execute(
        sa.text("SELECT job_id FROM metric_points UNION SELECT job_id FROM metric_values")
    )
    return sorted(j for (j,) in rows)


def _counts(s: Session, sql: str, job_id: str) -> dict[tuple[Any, ...], int]:
    return {tuple(r[:-1]): int(r[-1]) for r in s.execute(sa.text(sql), {"job": job_id})}


def _points_in_chunks(s: Session, job_id: str) -> bool:
    """Every step series (and the cursor's) holds, per attempt, as many steps as the rows."""
    rows = _counts(
        s,
        "SELECT attempt, count(*) FROM metric_points WHERE job_id = :job GROUP BY attempt",
        job_id,
    )
    chunks = _counts(
        s,
        "SELECT name, attempt, sum(count) FROM metric_chunks WHERE job_id = :job "
        f"AND kind = '{STEP_KIND}' GROUP BY name, attempt",
        job_id,
    )
    names = (*STEP_SERIES, MS, SEQ)
    return all(chunks.get((n, a), 0) == c for (a,), c in rows.items() for n in names)


def _values_in_chunks(s: Session, job_id: str) -> bool:
    """Every named series holds, per attempt, as many values as its rows, and each kind's
    record series as many records."""
    rows = _counts(
        s,
        "SELECT kind, name, attempt, count(*) FROM metric_values WHERE job_id = :job "
        "GROUP BY kind, name, attempt",
        job_id,
    )
    records = _counts(
        s,
        "SELECT kind, attempt, count(DISTINCT step) FROM metric_values WHERE job_id = :job "
        "GROUP BY kind, attempt",
        job_id,
    )
    chunks = _counts(
        s,
        "SELECT kind, name, attempt, sum(count) FROM metric_chunks WHERE job_id = :job "
        f"AND kind <> '{STEP_KIND}' GROUP BY kind, name, attempt",
        job_id,
    )
    if any(chunks.get(key, 0) != c for key, c in rows.items()):
        return False
    return all(
        chunks.get((kind, name, a), 0) == c
        for (kind, a), c in records.items()
        for name in RECORD_SERIES
    )


def _rollups_match(s: Session, job_id: str) -> bool:
    """Every chunk has its level-0 roll-up with the chunk's count (a move cut short before
    its roll-ups were rebuilt shows here)."""
    missing = s.execute(
        sa.text(
            "SELECT 1 FROM metric_chunks c LEFT JOIN metric_rollups r ON r.job_id = c.job_id "
            "AND r.kind = c.kind AND r.name = c.name AND r.level = 0 AND r.idx = c.chunk "
            "AND r.attempt = c.attempt WHERE c.job_id = :job "
            "AND (r.count IS NULL OR r.count <> c.count) LIMIT 1"
        ),
        {"job": job_id},
    ).first()
    return missing is None


_POINTS = sa.text(
    "SELECT * FROM metric_points WHERE job_id = :job AND id > :after ORDER BY id LIMIT :n"
)
_VALUES = sa.text(
    "SELECT * FROM metric_values WHERE job_id = :job AND id > :after ORDER BY id LIMIT :n"
)


def _move(s: Session, job_id: str, sql: Any, whole_records: bool) -> None:
    """Merge a job's rows of one table into the chunks (every series they reach: the step
    fields, the named values, the record series), batch by batch."""
    bound = sql.bindparams(job=job_id)
    after = 0
    while rows := _0015._batch(s, bound, after, whole_records):
        after = rows[-1]["id"]
        points, values = ([], rows) if whole_records else (rows, [])
        chunk_writes.append(s, points, values, pack=True, keyed_open=False)


def downgrade() -> None:
    _create_tables()
    s = Session(bind=op.get_bind())
    # numpy with the reads, as the API loads it (the migration runs in its environment).
    from amptrain.store.history import points, values

    job_ids = [j for (j,) in s.execute(sa.text("SELECT DISTINCT job_id FROM metric_chunks"))]
    point_cols = ["job_id", "attempt", "stream_ms", "stream_seq", *STORED_METRIC_FIELDS]
    for job_id in sorted(job_ids):
        after: str | None = None
        while True:
            page = points.Page(after, BATCH, "all")
            items, after = points.metric_page(s, job_id, page)
            if not items:
                break
            rows = [_row(job_id, i) for i in items]
            s.execute(
                _insert("metric_points", point_cols), [{c: r[c] for c in point_cols} for r in rows]
            )
        for kind in VALUE_KINDS:
            after = None
            while True:
                items, after = values.eval_page(s, job_id, points.Page(after, BATCH, "all"), kind)
                if not items:
                    break
                rows = [
                    {
                        **_cursor(i),
                        "job_id": job_id,
                        "attempt": i["attempt"],
                        "step": i["step"],
                        "kind": kind,
                        "name": name,
                        "value": value,
                        "time": i["time"],
                    }
                    for i in items
                    for name, value in i["values"].items()
                ]
                s.execute(_insert("metric_values", list(rows[0])), rows)
    s.flush()


def _cursor(item: dict[str, Any]) -> dict[str, int]:
    ms, seq = item["cursor"].split("-")
    return {"stream_ms": int(ms), "stream_seq": int(seq)}


def _row(job_id: str, item: dict[str, Any]) -> dict[str, Any]:
    row = {**item, **_cursor(item), "job_id": job_id}
    ranks = row.get("memory_peak_per_rank")
    # The JSON column's text, as the recorder wrote it (a list would bind as an array).
    row["memory_peak_per_rank"] = None if ranks is None else json.dumps(ranks)
    return row


def _insert(table: str, columns: list[str]) -> Any:
    names = ", ".join(columns)
    marks = ", ".join(f":{c}" for c in columns)
    return sa.text(f"INSERT INTO {table} ({names}) VALUES ({marks})")


def _create_tables() -> None:
    """The four tables as revision 0016 left them (their columns in 0016's order)."""
    types: dict[str, sa.types.TypeEngine[Any]] = {
        "int": sa.Integer(),
        "float": sa.Float(),
        "bool": sa.Boolean(),
        "bytes": sa.BigInteger(),
        "ints": sa.JSON(),
    }
    op.create_table(
        "metric_points",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("stream_ms", sa.BigInteger(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        *(sa.Column(m.name, types[m.type], nullable=m.name != "step") for m in STEP_METRICS),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_points_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_metric_points"),
        sa.UniqueConstraint(
            "job_id", "attempt", "step", name="uq_metric_points_job_id_attempt_step"
        ),
    )
    op.create_index("ix_metric_points_job_id_step", "metric_points", ["job_id", "step"])
    op.create_index(
        "ix_metric_points_job_id_stream_ms_stream_seq",
        "metric_points",
        ["job_id", "stream_ms", "stream_seq"],
    )
    op.create_table(
        "metric_values",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("stream_ms", sa.BigInteger(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), server_default="eval", nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_values_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_metric_values"),
        sa.UniqueConstraint(
            "job_id",
            "kind",
            "name",
            "step",
            "attempt",
            name="uq_metric_values_job_id_kind_name_step_attempt",
        ),
    )
    op.create_index(
        "ix_metric_values_job_id_stream_ms_stream_seq",
        "metric_values",
        ["job_id", "stream_ms", "stream_seq"],
    )
    _create_summaries(types)


def _create_summaries(types: dict[str, sa.types.TypeEngine[Any]]) -> None:
    counts = ("points", "first_step", "last_step", "skipped", "non_finite", "flagged")
    extremes = [
        sa.Column(c, sa.Integer() if c.endswith("_step") else types[m.type], nullable=True)
        for m in STEP_METRICS
        if m.extremes
        for c in (f"{m.name}_min", f"{m.name}_min_step", f"{m.name}_max", f"{m.name}_max_step")
    ]
    op.create_table(
        "metric_summaries",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        *(sa.Column(c, sa.Integer(), nullable=False) for c in counts),
        sa.Column("first_flag", sa.Integer(), nullable=True),
        *extremes,
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_summaries_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "level", "idx", name="pk_metric_summaries"),
    )
    flagged = sa.text("flagged > 0")
    op.create_index(
        "ix_metric_summaries_job_id_level_idx",
        "metric_summaries",
        ["job_id", "level", "idx"],
        sqlite_where=flagged,
        postgresql_where=flagged,
    )
    op.create_table(
        "metric_summary_state",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("stream_ms", sa.BigInteger(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("top", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_summary_state_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_metric_summary_state"),
    )
