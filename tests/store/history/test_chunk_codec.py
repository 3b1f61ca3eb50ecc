"""A chunk's bytes give back exactly what was packed: steps with and without gaps, NaN,
the infinities and nulls apart, open (raw) and closed (compressed) alike, through both
readers (the recorder's standard-library one and series_scan's numpy one); a format this
version does not know is refused, not misread."""

from __future__ import annotations

import math
import struct
from array import array

import numpy as np
import pytest

from amptrain.store.history import chunk_codec, series_scan

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
