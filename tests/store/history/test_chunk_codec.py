"""A chunk's bytes give back exactly what was packed: steps with and without gaps, NaN,
the infinities and nulls apart, open (raw) and closed (compressed) alike, through both
readers (the recorder's standard-library one and series_scan's numpy one); a format this
version does not know is refused, not misread."""

from __future__ import annotations

import math
import random
import struct
from array import array
from typing import Any

import numpy as np
import pytest

from amptrain.store.history import (
    chunk_codec,
    chunk_load,
    chunk_parts,
    chunk_table,
    chunk_writes,
    series_scan,
)
from tests.support.history_data import series

CASES = {
    "contiguous": (list(range(512, 768)), [0.1 * i for i in range(256)], None),
    "gaps": ([600, 601, 650, 700, 767], [1e-3, math.nan, math.inf, -math.inf, 2.5], None),
    "nulls": ([520, 521, 522], [1.0, math.nan, 3.0], bytes([0, 1, 0])),
    "all null": (list(range(530, 540)), [math.nan] * 10, bytes([1] * 10)),
    "float32 losses": (
        list(range(512, 612)),
        [float(np.float32(1 / (i + 1))) for i in range(100)],
        None,
    ),
}


@pytest.mark.parametrize("pack", [False, True], ids=["open", "closed"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_chunk_gives_back_what_was_packed(case: str, pack: bool) -> None:
    steps, values, nulls = CASES[case]
    data = chunk_codec.encode(512, array("q", steps), array("d", values), nulls, pack)
    d = chunk_codec.decode(512, data)
    assert list(d.steps) == steps
    assert [struct.pack("<d", v) for v in d.values] == [struct.pack("<d", v) for v in values]
    assert d.nulls == nulls
    s, v = series_scan.decode(512, data)
    assert s.tolist() == steps
    assert v.tobytes() == array("d", values).tobytes()


def test_chunks_decoded_together_are_each_chunk_decoded_alone() -> None:
    """A read decodes hundreds of chunks in one batch (their steps, nulls and values joined
    by numpy): every chunk, of whatever length, with gaps, nulls, open or closed, and in
    whatever order, reads as the standard-library decoder gives it alone."""
    rng = random.Random(11)
    chunks = []
    for i in range(60):
        steps, values, nulls = CASES[rng.choice(list(CASES))]
        first = 512 * (i + 1)
        moved = [s - 512 + first for s in steps]
        data = chunk_codec.encode(first, array("q", moved), array("d", values), nulls, i % 3 > 0)
        chunks.append((("loss", i, 1), first, data))
    rng.shuffle(chunks)
    decoded = chunk_load.decode_many(chunks)
    assert list(decoded) == [key for key, _, _ in chunks]
    again = chunk_load.Decoded.of(dict(decoded))
    for key, first, data in chunks:
        alone = chunk_codec.decode(first, data)
        for got in (decoded[key], again[key]):
            assert got.steps.tolist() == list(alone.steps)
            assert got.values.tobytes() == alone.values.tobytes()
            nulls = None if got.nulls is None else bytes(got.nulls.astype(np.uint8))
            assert nulls == alone.nulls


def test_closed_chunks_of_float32_values_take_about_four_bytes_a_value() -> None:
    steps, values, _ = CASES["float32 losses"]
    data = chunk_codec.encode(512, array("q", steps), array("d", values), None, True)
    assert len(data) < 4.5 * len(values)


def test_an_unknown_format_is_refused() -> None:
    data = bytearray(chunk_codec.encode(0, array("q", [1]), array("d", [1.0]), None, True))
    data[0] = chunk_codec.VERSION + 1
    for decode in (chunk_codec.decode, series_scan.decode):
        with pytest.raises(ValueError, match="format"):
            decode(0, bytes(data))


def test_a_chunk_appended_batch_by_batch_is_the_chunk_written_at_once() -> None:
    """The recorder's fast append (rising steps after the stored ones) and the general merge
    (replays, re-sent ranges, out-of-order steps, malformed values) build the same chunks as
    one batch of every step: gaps, nulls and NaN where they were, first values kept."""
    rng = random.Random(3)
    steps = [s for s in range(1, 1500) if rng.random() > 0.05]  # a few steps never recorded
    points = series("job", steps, seed=5)
    for p in rng.sample(points, 20):
        p["lr"] = "1.5"  # not a number: null, wherever the batch lands
    at_once = _rows(chunk_writes.merge(chunk_parts.collect(points, []), {}))
    stored: dict[Any, chunk_writes.Stored] = {}
    i = 0
    while i < len(points):
        n = rng.choice([1, 2, 7, 40, 300])
        batch = points[i : i + n]
        if rng.random() < 0.3 and i:  # at-least-once delivery: a range sent again, reordered
            back = rng.randrange(0, i)
            batch = rng.sample(points[back:i], min(5, i - back)) + batch
        parts = chunk_parts.collect(batch, [])
        for row in chunk_writes.merge(parts, {k: stored[k] for k in parts if k in stored}):
            stored.update(_rows([row]))
        i += n
    by_batch = {
        key: (list(d.steps), d.values.tobytes(), d.nulls, t_first, t_last)
        for key, (d, t_first, t_last) in stored.items()
    }
    assert by_batch == {
        key: (list(d.steps), d.values.tobytes(), d.nulls, t_first, t_last)
        for key, (d, t_first, t_last) in at_once.items()
    }


def _rows(rows: list[tuple[Any, ...]]) -> dict[Any, chunk_writes.Stored]:
    out = {}
    for row in rows:
        key = tuple(row[:5])
        at = dict(zip(chunk_table.COLUMNS, row, strict=True))
        decoded = chunk_codec.decode(key[3] * chunk_codec.CHUNK_STEPS, at["data"])
        out[key] = (decoded, at["time_first"], at["time_last"])
    return out
