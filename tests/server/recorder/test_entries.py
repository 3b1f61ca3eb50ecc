"""Stream entries as the recorder's rows: what the worker's sink writes comes back exactly,
and a value that is not the JSON scalar its column takes never reaches SQL as something
else (a PostgreSQL batch would fail on it, or a column would hold the wrong kind)."""

from __future__ import annotations

from typing import Any

import pytest

from amptrain.contract.records import event, metric
from amptrain.contract.stream import Fields, encode
from amptrain.server.recorder.entries import parse

JOB = "j_" + "a" * 32


def flat(fields: Fields, as_bytes: bool = True) -> list[Any]:
    """An entry's fields as hiredis returns them: [name, value, name, value, ...] (a packed
    field's value stays bytes either way)."""
    out: list[Any] = []
    for k, v in fields.items():
        value = v.encode() if as_bytes and isinstance(v, str) else v
        out += [k.encode() if as_bytes else k, value]
    return out


def entry(seq: int, fields: Fields, as_bytes: bool = True) -> tuple[Any, list[Any]]:
    eid = f"1700000000000-{seq}"
    return (eid.encode() if as_bytes else eid), flat(fields, as_bytes)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "flat"])
@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "str"])
def test_what_the_sink_writes_comes_back_as_its_row(as_bytes: bool, packed: bool) -> None:
    record = metric(
        step=7, time=1.5, loss=0.25, grad_norm=float("nan"), skipped=True, lr=0.1,
        loss_scale=65536, memory_peak=123, skipped_steps=2,
    )  # fmt: skip
    fields = encode(record, job_id=JOB, attempt=3, packed=packed)
    (row,) = parse(JOB, [entry(1, fields, as_bytes)]).points
    assert row["step"] == 7 and row["attempt"] == 3 and row["skipped"] is True
    assert (row["stream_ms"], row["stream_seq"]) == (1700000000000, 1)
    assert row["loss"] == 0.25 and row["grad_norm"] != row["grad_norm"]  # NaN kept
    assert row["loss_scale"] == 65536.0 and type(row["loss_scale"]) is float
    assert row["memory_peak"] == 123 and row["skipped_steps"] == 2
    assert row["memory_allocated"] is None  # absent from the record: null


def test_data_parallel_fields_are_checked() -> None:
    good = encode(metric(step=1, world_size=2, memory_peak_per_rank=[5, 6]), job_id=JOB, attempt=1)
    bad = {**good, "step": "2", "memory_peak_per_rank": '["x"]'}
    rows = parse(JOB, [entry(1, good), entry(2, bad)]).points
    assert [(r["world_size"], r["memory_peak_per_rank"]) for r in rows] == [
        (2, "[5, 6]"),
        (2, None),
    ]


@pytest.mark.parametrize(
    ("field", "text", "stored"),
    [
        ("loss", "1, 2", None),  # two values in one: never shifts the other columns
        ("skipped_steps", "1.5", 1.5),  # not an int: kept as sent, by the decode route
        ("loss", '"0.3"', "0.3"),
        ("memory_peak", "[1, 2]", [1, 2]),
    ],
)
def test_an_odd_value_takes_the_decode_route_and_shifts_nothing(
    field: str, text: str, stored: Any
) -> None:
    fields = encode(metric(step=4, lr=0.5, loss=1.0), job_id=JOB, attempt=1, packed=False)
    fields[field] = text
    rows = parse(JOB, [entry(1, fields)]).points
    if field == "loss" and text == "1, 2":
        assert rows == []  # not JSON: the entry is logged and dropped
        return
    (row,) = rows
    assert row[field] == stored and row["lr"] == 0.5 and row["step"] == 4


def test_events_ends_and_trimmed_entries() -> None:
    ev = encode({**event("checkpoint", 5, 12.5, url="mem://x")}, job_id=JOB, attempt=2)
    end = encode({"kind": "end", "status": "succeeded"}, job_id=JOB, attempt=2)
    no_attempt = {k: v for k, v in encode(metric(step=9), job_id=JOB, attempt=2).items()}
    del no_attempt["attempt"]
    batch = parse(
        JOB, [entry(1, ev), (b"1700000000000-2", None), entry(3, end), entry(4, no_attempt)]
    )
    assert [(e["type"], e["step"], e["source_id"]) for e in batch.events] == [
        ("checkpoint", 5, "1700000000000-1")
    ]
    assert batch.ends == [2] and batch.points == []
