"""The evaluation and layer-norm windows (``eval_window``) search primary keys on a database
that was never analysed: no statement of theirs scans ``metric_chunks`` or sorts it, and a
read runs as many statements for a run three times as long. Real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.history import rollups
from amptrain.store.history.eval_window import eval_window
from tests.store.history.test_consumer_plans import _plan, _Statements
from tests.support.plans import SORT_NODE


def _run(sf: sessionmaker[Session], steps: int) -> str:
    """Attempt 1 evaluates every 10 steps to ``steps`` (two names, four layers' norms);
    attempt 2 re-evaluates the last 500, through the recorder's write."""
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": steps}
    )
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec, "alice", "cpu").id
    for attempt, first in ((1, 10), (2, steps - 490)):
        values: list[dict[str, Any]] = []
        for step in range(first, steps + 1, 10):
            ms = 10**12 + attempt * 10**8 + step
            named = [(EVAL_KIND, n, (step % 17) / 17) for n in ("eval_loss", "accuracy")]
            named += [(LAYER_NORM_KIND, f"l.{i}", (step % 13) + i) for i in range(4)]
            values += [
                {"job_id": job_id, "attempt": attempt, "step": step, "kind": kind, "name": name}
                | {"value": v, "time": ms / 1000, "stream_ms": ms, "stream_seq": 0}
                for kind, name, v in named
            ]
        with sf.begin() as s:
            rollups.record(s, [], values)
    return job_id


def _statements(sf: sessionmaker[Session], job_id: str, steps: int) -> list[tuple[str, Any]]:
    with sf() as s, _Statements(sf.kw["bind"]) as seen:
        for kind in (EVAL_KIND, LAYER_NORM_KIND):
            assert len(eval_window(s, job_id, 100, kind=kind).items) <= 100
            mid = eval_window(s, job_id, 50, steps // 3, steps // 2 + 5, kind=kind).items
            assert mid and all(steps // 3 <= i["step"] <= steps // 2 + 5 for i in mid)
            whole = eval_window(s, job_id, 10_000, steps - 700, None, kind=kind).items
            assert len(whole) == 71 and not any(i["downsampled"] for i in whole)
    return seen.seen


def test_the_windows_search_the_primary_key_without_statistics(
    sf: sessionmaker[Session],
) -> None:
    engine = sf.kw["bind"]
    short, long = _run(sf, 10_000), _run(sf, 30_000)
    assert len(_statements(sf, long, 30_000)) == len(_statements(sf, short, 10_000))
    for statement, params in _statements(sf, long, 30_000):
        plan = _plan(engine, statement, params)
        if engine.dialect.name == "sqlite":
            assert "SCAN metric_chunks" not in plan and "TEMP B-TREE" not in plan, plan
        else:
            assert not any(w in plan for w in ("Seq Scan", SORT_NODE, "Aggregate")), plan


def test_every_names_attempt_spans_come_in_one_statement_without_statistics(
    sf: sessionmaker[Session],
) -> None:
    """The names' attempt spans (``chunk_cover.attempt_runs_of``): one statement for all of
    a window's names, not one per name, an index range of the top roll-ups per name."""
    engine = sf.kw["bind"]
    job_id = _run(sf, 30_000)
    seen: list[tuple[str, Any]] = []

    def spy(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "metric_rollups" in statement:
            seen.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", spy)
    try:
        with sf() as s:
            assert len(eval_window(s, job_id, 100, kind=LAYER_NORM_KIND).items) <= 100
    finally:
        sa.event.remove(engine, "before_cursor_execute", spy)
    spans = [(st, p) for st, p in seen if "GROUP BY" in st]
    # the window's count (@ms) and all four layers' spans: two statements, not five
    assert len(spans) == 2, spans
    # (grouping sorts the top roll-ups it found: a row per 65,536 steps and attempt)
    for statement, params in spans:
        plan = _plan(engine, statement, params)
        bad = "SCAN metric_rollups" if engine.dialect.name == "sqlite" else "Seq Scan"
        assert bad not in plan, plan


def test_sqlite_reads_lone_keys_in_lists_through_the_primary_key(
    sf: sessionmaker[Session],
) -> None:
    """On SQLite the roll-ups and edge chunks of a name come a statement per run of
    consecutive keys and per IN list of lone keys (``chunk_stats._sqlite_keys``), each a
    search of the primary key: a window whose buckets cut every chunk (a 100k-step run's
    layer norms) ran a statement per key before."""
    from amptrain.store.history import chunk_stats

    ids = [3, 4, 5, 9, *range(20, 1300, 2)]
    parts = chunk_stats._sqlite_keys(ids)
    covered = [
        k
        for where, keys in parts
        for k in (range(keys[0], keys[1] + 1) if "BETWEEN" in where else keys)
    ]
    assert sorted(covered) == ids and len(parts) == 1 + 2  # a run, 641 lone keys in two lists
    engine = sf.kw["bind"]
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        for base, col in (
            (chunk_stats._NODES_SQLITE, "r.idx"),
            (chunk_stats._CHUNKS_SQLITE, "chunk"),
        ):
            for where, keys in parts:
                params = ("j", "layer_grad_norm", "l.0", *((0,) if col == "r.idx" else ()), 1)
                rows = conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + base + where.format(col=col), (*params, *keys)
                ).all()
                plan = "\n".join(str(r[-1]) for r in rows)
                assert "SEARCH" in plan and "SCAN" not in plan, plan
