"""Plain metric entries decoded a batch at a time give exactly the rows the per-entry
route gives, for every odd value in every column, and keep stream order beside entries of
other kinds and layouts."""

from __future__ import annotations

from typing import Any

import pytest

from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.records import evaluation, metric
from amptrain.contract.stream import Fields, encode
from amptrain.server.recorder import plain_points
from amptrain.server.recorder.entries import _parse, parse
from tests.server.recorder.test_entries import JOB, entry

ODD = ["1", "7.0", "-2", "1e400", "NaN", "-Infinity", "true", "false", "null", "", " 3",
       "nan", "1_0", "1, 2", '"0.3"', "[1]", "{}", "1],[2"]  # fmt: skip


def step(i: int, attempt: int = 1, packed: bool = True) -> Fields:
    record = metric(
        step=i, time=1.5 + i, loss=1.0 / i, loss_scale=65536, skipped=False, grad_norm=0.5,
        lr=0.1, memory_peak=100 + i, samples_per_second=512.0, step_time_ms=3.0, skipped_steps=0,
    )  # fmt: skip
    return encode(record, job_id=JOB, attempt=attempt, packed=packed)


def same(entries: list[Any]) -> list[dict[str, Any]]:
    """parse's rows, checked against the per-entry route's (repr: NaN, and 1 vs 1.0)."""
    rows = parse(JOB, entries).points
    assert repr(rows) == repr(_parse(JOB, entries).points)
    return rows


@pytest.mark.parametrize("field", ["attempt", *METRIC_FIELDS])
def test_every_odd_value_in_every_column_gives_the_per_entry_rows(field: str) -> None:
    for text in ODD:  # an older worker's flat entries
        odd = {**step(2, packed=False), field: text}
        same([entry(1, step(1, packed=False)), entry(2, odd), entry(3, step(3, packed=False))])


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "flat"])
def test_plain_batches_decode_in_bulk_with_floats_as_floats(packed: bool) -> None:
    entries = [entry(i, step(i, packed=packed)) for i in range(1, 6)]
    assert plain_points.columns(JOB, entries) is not None  # the bulk route, not the fallback
    rows = same(entries)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(type(r["loss_scale"]) is float and type(r["step"]) is int for r in rows)
    assert [r["stream_seq"] for r in rows] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "flat"])
def test_other_kinds_and_layouts_keep_stream_order(packed: bool) -> None:
    parallel = encode(
        metric(step=3, world_size=2, memory_peak_per_rank=[5, 6]), job_id=JOB, attempt=1
    )
    ev = encode(evaluation(4, 9.0, {"eval_loss": 0.5}), job_id=JOB, attempt=1)
    entries = [
        entry(1, step(1, packed=packed)),
        entry(2, step(2, packed=packed)),
        entry(3, parallel),
        entry(4, ev),
        entry(5, step(5, packed=packed)),
    ]
    batch = parse(JOB, entries)
    assert [r["step"] for r in batch.points] == [1, 2, 3, 5]
    assert [(v["name"], v["step"]) for v in batch.values] == [("eval_loss", 4)]
    same(entries)
    same([(b"1700000000000-9", None), *entries[:2], entry(6, ev)])
