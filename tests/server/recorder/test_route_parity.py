"""The recorder's two routes store the same bytes: plain metric entries decoded as columns
(:mod:`amptrain.server.recorder.plain_points`) and the per-entry route's rows. Two jobs get
the same batches under the same entry ids, one in the worker sink's field order (the
columnar route) and one with each entry's fields reversed (the per-entry route), through
the real recorder; every chunk, roll-up and exemplar row and the jobs' step and summary
must be equal. The batches hold the odd cases: chunk boundaries inside a batch, gaps,
steps out of order, re-sent ranges, nulls, NaN and infinities, skipped steps, a value
that is not plain, evaluations among the points, an attempt change inside a batch. Real
Redis, real SQLite and PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import redis
import sqlalchemy as sa

from amptrain.contract.records import evaluation
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.server.recorder.entries import parse
from amptrain.server.recorder.service import Recorder
from tests.server.recorder.test_recorder import Sessions, point, start_job


def _odd_point(step: int, attempt: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"loss": 1.0 / step + attempt, "skipped": step % 29 == 0}
    if step % 31 == 0:
        kw["loss"] = (math.nan, math.inf, None, -math.inf)[step % 4]
    if step % 37 == 0:
        kw["grad_norm"] = (math.nan, math.inf, None)[step % 3]
    if step % 53 == 0:  # a CPU run's memory: null
        kw |= {"memory_allocated": None, "memory_reserved": None, "memory_peak": None}
    if step % 41 == 0:
        kw["samples_per_second"] = None
    return point(step, time=1000.0 + step + 10_000 * attempt, **kw)


def _steps(attempt: int, *ranges: range | list[int]) -> list[tuple[int, int]]:
    return [(attempt, step) for steps in ranges for step in steps]


BATCHES: list[list[tuple[int, int]]] = [
    _steps(1, range(1, 101)),
    _steps(1, range(101, 300)),  # across the chunk boundary at 256
    _steps(1, range(320, 341), range(400, 421)),  # gaps
    _steps(1, range(250, 281)),  # re-sent: nothing new
    _steps(1, [430, 425, 600, 431, 429, 599, 432]),  # out of order, back and forth
    _steps(1, range(433, 440), [601]),  # 601 is not plain: the batch goes per entry
    _steps(1, range(440, 445), range(200, 205)),  # new and old steps
    _steps(1, range(445, 450)) + _steps(2, range(180, 260)),  # attempt 2 resumes
    _steps(2, range(260, 520)) + _steps(1, range(450, 452)),  # a late attempt 1 tail
    _steps(2, range(520, 530), range(1, 5)),
]
NOT_PLAIN = 601


def _items(steps: list[tuple[int, int]]) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    for attempt, step in steps:
        if step == NOT_PLAIN:
            out.append((attempt, point(step, loss=True)))
            continue
        out.append((attempt, _odd_point(step, attempt)))
        if step % 50 == 0:
            out.append((attempt, evaluation(step, 1000.5 + step, {"eval_loss": 2.0 / step})))
    return out


def _publish(r: redis.Redis, jobs: tuple[str, str], k: int, seq: int) -> int:
    """Batch ``k`` into both jobs' streams under the same entry ids; the last id's seq."""
    columnar, per_entry = jobs
    for attempt, item in _items(BATCHES[k]):
        seq += 1
        eid = f"1700000000000-{seq}"
        fields = encode(item, job_id=columnar, attempt=attempt)
        r.xadd(Keys.telemetry(columnar), fields, id=eid)  # type: ignore[arg-type]
        fields = encode(item, job_id=per_entry, attempt=attempt)
        # Another field order: not the sink's, so not plain.
        r.xadd(Keys.telemetry(per_entry), dict(reversed(fields.items())), id=eid)  # type: ignore[arg-type]
    return seq


def _route(r: redis.Redis, job_id: str) -> bool:
    """Whether the job's stream decodes as columns."""
    entries = [
        (eid, [x for kv in fields.items() for x in kv])
        for eid, fields in r.xrange(Keys.telemetry(job_id))  # type: ignore[union-attr]
    ]
    return parse(job_id, entries).columns is not None


TABLES = {
    "metric_chunks": "kind, name, chunk, attempt",
    "metric_rollups": "kind, name, level, idx, attempt",
    "metric_exemplars": "level, idx, attempt",
}


def _stored(sf: Sessions, job_id: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with sf() as s:
        for table, order in TABLES.items():
            rows = s.execute(
                sa.text(f"SELECT * FROM {table} WHERE job_id = :j ORDER BY {order}"), {"j": job_id}
            ).mappings()
            out[table] = [
                repr({k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()
                      if k != "job_id"})
                for row in rows
            ]  # fmt: skip
        job = s.execute(
            sa.text("SELECT step, summary FROM jobs WHERE id = :j"), {"j": job_id}
        ).one()
        out["jobs"] = [repr(tuple(job))]
    return out


def test_columns_and_rows_store_the_same_bytes(sf: Sessions, r: redis.Redis) -> None:
    columnar, _ = start_job(sf)
    per_entry, _ = start_job(sf)
    rec = Recorder(None, sf, r)
    seq = 0
    for k in range(len(BATCHES)):
        seq = _publish(r, (columnar, per_entry), k, seq)
        if k == 0:
            assert _route(r, columnar) and not _route(r, per_entry)
        rec.drain_once()
    a, b = _stored(sf, columnar), _stored(sf, per_entry)
    assert len(a["metric_chunks"]) > 40 and len(a["metric_exemplars"]) > 5
    for table in (*TABLES, "jobs"):
        assert a[table] == b[table], table
