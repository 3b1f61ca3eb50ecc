"""Packed metric entries (:mod:`amptrain.server.recorder.packed_points`) give exactly the rows
an older worker's flat entries give, by the batch's columns and by the per-entry route, for
every kind of value in every column; a packed field that is not one is logged and dropped
without failing its batch, in ``parse`` and in the real recorder."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import redis

from amptrain.contract import stream_pack
from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.server.recorder import plain_points
from amptrain.server.recorder.entries import _parse, parse
from amptrain.server.recorder.service import Recorder
from amptrain.store.history import points
from tests.server.recorder.test_entries import JOB, entry
from tests.server.recorder.test_plain_points import step
from tests.server.recorder.test_recorder import Sessions, publish, start_job
from tests.server.recorder.test_recorder import point as full_point

ODD: list[Any] = [
    0.25, -0.0, math.nan, math.inf, -math.inf, 7, 2**53 + 1, 2**63 - 1, -(2**63), True, False,
    None, 7.0,
]  # fmt: skip


def rows(entries: list[Any]) -> str:
    """parse's rows (repr: NaN, 1 vs 1.0), checked against the per-entry route's."""
    got = repr(parse(JOB, entries).points)
    assert got == repr(_parse(JOB, entries).points)
    return got


def batch(field: str, value: Any, *, packed: bool, uniform: bool) -> list[Any]:
    """Three steps with ``value`` in ``field`` at the second (at all three: ``uniform``)."""
    out = []
    for i in (1, 2, 3):
        fields = step(i, packed=packed)
        if uniform or i == 2:
            fields = encode(_point(i) | {field: value}, job_id=JOB, attempt=1, packed=packed)
        out.append(entry(i, fields))
    return out


def _point(i: int) -> dict[str, Any]:
    return full_point(i, loss_scale=65536)


@pytest.mark.parametrize("field", METRIC_FIELDS)
@pytest.mark.parametrize("uniform", [False, True], ids=["one", "all"])
def test_every_value_in_every_column_gives_the_flat_rows(field: str, uniform: bool) -> None:
    for value in ODD:
        packed = batch(field, value, packed=True, uniform=uniform)
        assert all(stream_pack.FIELD.encode() in e[1] for e in packed)
        flat = batch(field, value, packed=False, uniform=uniform)
        assert rows(packed) == rows(flat), (field, value)


def test_plain_packed_batches_decode_as_columns() -> None:
    # a null grad_norm at a skipped step: one column of mixed codes, still columns
    entries = batch("grad_norm", None, packed=True, uniform=False)
    got = parse(JOB, entries)
    assert got.columns is not None
    assert got.columns.column("grad_norm") == [0.5, None, 0.5]
    assert got.columns.column("loss_scale") == [65536.0] * 3  # an int column read as floats
    # an integer column holding a float: the per-entry route keeps every value as sent
    odd = batch("memory_peak", 1.5, packed=True, uniform=False)
    assert plain_points.columns(JOB, odd) is None
    assert [r["loss_scale"] for r in parse(JOB, odd).points] == [65536.0, 65536, 65536.0]


def _hostile_fields(blob: Any) -> dict[str, Any]:
    return {"kind": "metric", "job_id": JOB, "attempt": "1", stream_pack.FIELD: blob}


HOSTILE: list[Any] = [
    lambda good: good[:-8],  # a field short: the wrong length
    lambda good: bytes([99]) + good[1:],  # an unknown version
    lambda good: good[:1] + b"\x07" + good[2:],  # an unknown type code
    lambda good: b"\x01" + b"\xfe" * (len(good) - 1),  # garbage of the right length
]


@pytest.mark.parametrize("spoil", HOSTILE)
def test_a_hostile_packed_field_is_logged_and_dropped(
    spoil: Any, caplog: pytest.LogCaptureFixture
) -> None:
    good = step(2)[stream_pack.FIELD]
    entries = [entry(1, step(1)), entry(2, _hostile_fields(spoil(good))), entry(3, step(3))]
    with caplog.at_level(logging.ERROR):
        got = parse(JOB, entries)
    assert [p["step"] for p in got.points] == [1, 3]
    assert "undecodable stream entry 1700000000000-2 dropped" in caplog.text
    # a batch of such entries alone (every point's header alike: the uniform check)
    alike = [entry(i, _hostile_fields(spoil(step(i)[stream_pack.FIELD]))) for i in (1, 2)]
    assert parse(JOB, alike).points == []
    assert "undecodable stream entry 1700000000000-1 dropped" in caplog.text


def test_the_recorder_drops_a_hostile_entry_and_records_the_rest(
    sf: Sessions, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [_point(i) for i in range(1, 6)])
    good = stream_pack.pack(_point(6))
    assert good is not None
    for spoil in HOSTILE:
        r.xadd(Keys.telemetry(job_id), _hostile_fields(spoil(good)) | {"job_id": job_id})
    publish(r, job_id, attempt, [_point(i) for i in range(6, 11)])
    with caplog.at_level(logging.ERROR):
        Recorder(None, sf, r).drain_once()
    assert caplog.text.count("undecodable stream entry") == len(HOSTILE)
    with sf() as s:
        got, _ = points.metric_page(s, job_id, points.Page(limit=100))
    assert [p["step"] for p in got] == list(range(1, 11))
