"""Recomputing a job's derived history from its rows: its metric summaries
(:mod:`amptrain.store.history.summaries`, aggregated by the database), its chunks and their
roll-ups: for points written by other means than the recorder (tests and benchmarks
seeding millions of rows)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EXTREMA_FIELDS
from amptrain.store.history import chunk_writes, rollup_rebuild
from amptrain.store.history.layout import BASE, COLUMNS, DBL_MAX, MAX_LEVEL
from amptrain.store.models import MetricPoint, MetricSummary, MetricSummaryState, MetricValue


def rebuild(s: Session, job_id: str) -> None:
    """Recompute a job's summaries and state from its raw points, aggregated by the database;
    and bring its points and named values into its chunks and their roll-ups (what the
    reads read), as the recorder would have."""
    chunk_rows(s, job_id)
    rollup_rebuild.rebuild(s, job_id)
    s.execute(sa.delete(MetricSummary).where(MetricSummary.job_id == job_id))
    s.execute(sa.delete(MetricSummaryState).where(MetricSummaryState.job_id == job_id))
    for sql in rebuild_statements(job_filter=True, dialect=s.get_bind().dialect.name):
        s.execute(sa.text(sql), {"job_id": job_id})


def chunk_rows(s: Session, job_id: str, batch: int = 50_000) -> None:
    """Merge a job's points and named values into its chunks, ``batch`` rows at a time (a
    step already in a chunk keeps its value)."""
    for table, as_points in ((MetricPoint, True), (MetricValue, False)):
        after = 0
        while True:
            rows = [
                dict(r)
                for r in s.execute(
                    sa.select(table.__table__)
                    .where(table.job_id == job_id, table.id > after)
                    .order_by(table.id)
                    .limit(batch)
                ).mappings()
            ]
            if not rows:
                break
            after = rows[-1]["id"]
            chunk_writes.append(s, *((rows, []) if as_points else ([], rows)), pack=True)


def rebuild_statements(job_filter: bool, dialect: str) -> list[str]:
    """The SQL (SQLite and PostgreSQL alike) that builds every level and the state, for one
    job (``:job_id``) or for all."""
    only = " AND p.job_id = :job_id" if job_filter else ""
    only_m = " AND job_id = :job_id" if job_filter else ""
    only_c = " AND c.job_id = :job_id" if job_filter else ""
    finite = "({0} IS NOT NULL AND {0} BETWEEN -{1!r} AND {1!r})".format
    flag = "(p.skipped IS TRUE OR NOT {} OR (p.grad_norm IS NOT NULL AND NOT {}))".format(
        finite("p.loss", DBL_MAX), finite("p.grad_norm", DBL_MAX)
    )
    ext = ", ".join(
        f"min(CASE WHEN {finite('p.' + f, DBL_MAX)} THEN p.{f} END) AS {f}_min, "
        f"max(CASE WHEN {finite('p.' + f, DBL_MAX)} THEN p.{f} END) AS {f}_max"
        for f in EXTREMA_FIELDS
    )
    insert_cols = "job_id, level, idx, " + ", ".join(COLUMNS)
    ext_out = ", ".join(
        f"min(a.{f}_{k}), {{{f}_{k}}}" for f in EXTREMA_FIELDS for k in ("min", "max")
    )
    steps = {
        f"{f}_{k}": f"min(CASE WHEN e.{f} = a.{f}_{k} THEN e.step END)"
        for f in EXTREMA_FIELDS
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
        fin_loss=finite("p.loss", DBL_MAX),
        flag=flag,
        ext=ext,
        insert_cols=insert_cols,
        level=BASE,
        ext_out=ext_out.format(**steps),
    )
    statements = [base]
    up_ext = ", ".join(
        f"min(c.{f}_min) AS {f}_min, max(c.{f}_max) AS {f}_max" for f in EXTREMA_FIELDS
    )
    up_steps = {
        f"{f}_{k}": f"min(CASE WHEN c.{f}_{k} = a.{f}_{k} THEN c.{f}_{k}_step END)"
        for f in EXTREMA_FIELDS
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
